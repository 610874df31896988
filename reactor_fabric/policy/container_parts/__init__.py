"""The parts a container spec is composed of, one pure module per service option (see
:mod:`reactor_fabric.policy.container_spec`, which composes them)."""
