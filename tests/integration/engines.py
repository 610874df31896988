"""Which real-engine tests run against Podman too (``make test-podman``), and why the others do not.

The rule: Podman runs what differs between engines, not everything twice. A test runs on Podman
when what it checks is realised through the engine's API and may come out otherwise there:
container create payloads (mounts, pinned mounts and their verification after start, the
read-only and ``.git`` guards, tmpfs, users and accounts, capabilities, resource and memory
limits, memory readings, labels), attached and socket stdio and how exits are reported, exec,
image checks, networks and egress, secrets' delivery, the warm pool's staging and detached
mounts, removal and cleanup, the orchestrator's own image, agents' containers. A test whose
engine is incidental — the protocol, a client's view, auth, discovery, the bridge, metrics and
the audit trail, the status page, Kubernetes (whose runtime speaks only to the API server; the
engine merely backs the fake's pods) — runs on Docker only, and is named below with the reason
and, where the engine side of it matters, the test that covers that side on Podman.

Everything not named here runs on both engines: a new test runs on Podman until someone decides
otherwise (when in doubt, keep it there). On Podman the named tests are *deselected* (pytest
counts them as such), not skipped; ``REACTOR_FABRIC_PODMAN_ALL=1`` runs every test on Podman.

Keys are test files' names; a test function stands for all its parameters.
"""

from __future__ import annotations

# Whole modules: every test of the file runs on Docker only.
DOCKER_ONLY_MODULES: dict[str, str] = {
    "test_agent_specialists_e2e.py": (
        "which key, services and sessions the orchestrator gives specialists; on Podman an agent's "
        "container, secret and egress: test_agent_claude_code_e2e, its child session: "
        "test_git_guard_e2e's safe-mode agent, two accounts' delivery: test_secrets_e2e, "
        "test_egress_e2e"
    ),
    "test_auth_e2e.py": (
        "tokens, Origin and the bridge's token lookup: refused before any container is asked for"
    ),
    "test_sign_in_e2e.py": (
        "users signing in with an OpenID provider: the tokens are checked before any container is "
        "asked for; the container a signed-in call runs in is every relay test's"
    ),
    "test_oidc_provider_fixture.py": (
        "the test OpenID provider itself: no orchestrator, no container"
    ),
    "test_catalog_e2e.py": (
        "the catalog command's cache and ranking; its probes are every orchestrator's start-up "
        "probes, run on Podman by every kept test, and a missing image is test_relay_e2e's"
    ),
    "test_claude_code_e2e.py": (
        "Claude Code's tool search and calls through /mcp; per-call containers on Podman: "
        "test_fabric_lifecycles_e2e, test_lifecycles_e2e"
    ),
    "test_client_messages_e2e.py": (
        "what the Inspector CLI and Claude Code print of an error; a killed container's exit on "
        "Podman: test_relay_e2e's kill test"
    ),
    "test_error_paths_e2e.py": (
        "each client's report of refusals made before the engine is asked and of the shutdown; the "
        "shutdown's removals on Podman: test_relay_e2e's SIGTERM test"
    ),
    "test_fabric_e2e.py": (
        "the fabric endpoint's routing, meta-tools, discovery and clients; what it asks of the "
        "engine (per-session mounts, idle removal, a missing image) on Podman: test_relay_e2e"
    ),
    "test_image_locks.py": (
        "the image recipes' locks at build time (scripts/build-images): no orchestrator, no "
        "container of ours"
    ),
    "test_images_stdio.py": (
        "the images' servers under `docker run -i` (the CLI's payload, not ours); the "
        "orchestrator's own path to each image on Podman: test_docker_api_stdio"
    ),
    "test_input_required_e2e.py": (
        "MCP's multi-round-trip retry routed to the container that asked; per-call containers on "
        "Podman: test_fabric_lifecycles_e2e, test_lifecycles_e2e"
    ),
    "test_kube_fake.py": "the fake Kubernetes API server itself (test infrastructure)",
    "test_kube_fake_network_policies.py": (
        "the fake Kubernetes API server's NetworkPolicies (test infrastructure)"
    ),
    "test_kubernetes_e2e.py": (
        "runtime: kubernetes speaks only to the API server; the engine merely backs the fake's pods"
    ),
    "test_kubernetes_egress_e2e.py": (
        "runtime: kubernetes speaks only to the API server; the engine merely backs the fake's pods"
    ),
    "test_kubernetes_runtime_pods.py": (
        "runtime: kubernetes speaks only to the API server; the engine merely backs the fake's pods"
    ),
    "test_langchain_e2e.py": "a client library's view of /mcp",
    "test_observability_e2e.py": (
        "the audit trail, /metrics, the sessions command and Prometheus record what the "
        "orchestrator saw; exits and removals on Podman: test_relay_e2e"
    ),
    "test_replicas_e2e.py": "sessions routed to their replica behind nginx",
    "test_side_by_side_e2e.py": "two orchestrators' audit trails in one state directory",
    "test_status_page_e2e.py": "the status page in a browser",
    "test_tracing_e2e.py": "OpenTelemetry spans at a collector",
    "test_transports_e2e.py": (
        "every client transport and the bridge; per-session mounts on Podman: test_relay_e2e, "
        "test_warm_pool_e2e"
    ),
}

# Single tests (every parameter of each) of modules whose other tests run on both engines.
DOCKER_ONLY_TESTS: dict[str, dict[str, str]] = {
    "test_accounts_e2e.py": {
        "test_another_users_private_directory_is_not_mountable_through_a_users_orchestrator": (
            "refused by the pinning, as the user, before the engine is asked"
        ),
    },
    "test_agent_claude_code_e2e.py": {
        "test_without_danger_mode_the_agent_has_no_shell_and_an_edit_outside_the_workspace_is_denied": (  # noqa: E501
            "the CLI's permissions in safe mode; the agent's container on Podman: the mounted "
            "project test"
        ),
        "test_without_danger_mode_a_shell_command_the_model_asks_for_is_refused_by_the_cli": (
            "the CLI's refusal in safe mode"
        ),
        "test_a_task_that_looks_like_an_option_is_the_models_prompt_in_either_mode": (
            "the agent server's command line and stdin for the CLI, inside the image"
        ),
        "test_the_projects_own_claude_configuration_does_not_configure_the_agent_in_either_mode": (
            "the CLI's options against the project's settings files, inside the image"
        ),
        "test_a_gateway_giving_every_message_one_id_is_stopped_at_the_turn_limit": (
            "the agent server's turn count from the model's stream"
        ),
        "test_in_danger_mode_the_agent_runs_a_shell_command_without_a_prompt": (
            "the CLI's danger mode; a danger-mode agent's shell in its container on Podman: "
            "test_git_guard_e2e"
        ),
        "test_a_task_past_its_wall_time_answers_is_error_with_the_reason": (
            "the wall time is the agent server's; stopping a running agent's container on Podman: "
            "test_agent_limits_e2e's cancelled call"
        ),
    },
    "test_agent_limits_e2e.py": {
        "test_a_second_agent_call_of_a_session_at_its_limit_is_answered_agent_busy_at_once": (
            "the orchestrator's per-session agent limit, answered without a container"
        ),
        "test_a_client_that_goes_away_mid_call_stops_the_agent_and_its_container_goes": (
            "the same stop of a running agent's container as the cancelled call's, run on Podman"
        ),
    },
    "test_bounds_e2e.py": {
        "test_a_server_request_nobody_answers_does_not_hold_the_container_past_its_idle_timeout": (
            "the expiry of a server's request; idle removal on Podman: test_relay_e2e's idle test"
        ),
        "test_an_http_session_its_client_never_ends_goes_at_the_idle_timeout": (
            "the expiry of an HTTP session; idle removal on Podman: test_relay_e2e's idle test"
        ),
    },
    "test_fabric_lifecycles_e2e.py": {
        "test_a_stateless_client_on_a_keyed_url_gets_a_fresh_container_for_every_call": (
            "the keyed URL's sessions; per-call containers on Podman: the five-calls test here"
        ),
        "test_a_stateless_client_answers_a_per_call_servers_elicitation_through_input_required": (
            "MCP's multi-round-trip retry routed to the container that asked"
        ),
        "test_a_smart_refresh_container_is_replaced_after_its_calls_and_the_client_sees_no_error": (
            "replacing after N calls is the orchestrator's decision; removing a session's container"
            " and starting the next on Podman: test_relay_e2e's idle test, the per-call tests"
        ),
        "test_a_smart_refresh_container_a_call_took_over_its_memory_threshold_serves_no_next_call": (  # noqa: E501
            "the same memory reading and replacement on /mcp as test_lifecycles_e2e's on the relay,"
            " run on Podman"
        ),
        "test_an_idle_smart_refresh_container_goes_at_its_age_and_the_next_call_gets_a_fresh_one": (
            "replacing at an age is the orchestrator's decision; removing a session's container and"
            " starting the next on Podman: test_relay_e2e's idle test, the per-call tests"
        ),
    },
    "test_lifecycles_e2e.py": {
        "test_smart_refresh_replaces_the_container_after_its_calls_the_client_seeing_no_error": (
            "replacing after N calls is the orchestrator's decision; removing a session's container"
            " and starting the next on Podman: test_relay_e2e's idle test, the per-call tests"
        ),
        "test_smart_refresh_replaces_a_container_older_than_its_age_the_client_seeing_no_error": (
            "replacing at an age is the orchestrator's decision; removing a session's container and"
            " starting the next on Podman: test_relay_e2e's idle test, the per-call tests"
        ),
    },
    "test_relay_e2e.py": {
        "test_progress_notifications_and_a_server_to_client_request_pass_through": (
            "messages passed between server and client"
        ),
        "test_an_unreachable_docker_engine_answers_32001_and_the_orchestrator_keeps_serving": (
            "no engine at all (a dead socket)"
        ),
    },
    "test_security_e2e.py": {
        "test_a_client_cannot_mount_its_own_files_over_the_services_command": (
            "the mount policy refuses the target before the engine is asked"
        ),
        "test_a_keyed_url_belongs_to_its_first_client_others_and_tokenless_requests_are_refused": (
            "the keyed URL's owner and the token"
        ),
        "test_a_keyed_session_registered_in_its_body_is_not_joined_by_its_key_alone": (
            "the keyed URL's owner"
        ),
    },
    "test_serve_healthz.py": {
        "test_healthz_is_503_when_the_docker_engine_is_unreachable": (
            "no engine at all (a dead socket)"
        ),
    },
    "test_suite_lock_e2e.py": {
        "test_enforce_or_warn_without_a_lock_file_stops_the_orchestrator_before_it_serves": (
            "refused at start, before the engine is asked"
        ),
        "test_under_enforce_a_changed_tool_is_refused_on_both_endpoints_and_the_others_work": (
            "tool definitions against the lock; image ids on Podman: the two-builds test here"
        ),
        "test_a_description_rewritten_at_runtime_is_caught_mid_session_and_refused_under_enforce": (
            "tool definitions against the lock"
        ),
        "test_a_tools_list_answered_under_its_id_as_a_string_is_checked_before_the_typescript_sdk": (  # noqa: E501
            "the relay's scan of a list, as a client parses it"
        ),
        "test_a_tool_listed_twice_reaches_the_typescript_sdk_once_as_locked": (
            "the relay's scan of a list, as a client parses it"
        ),
    },
    "test_warm_pool_e2e.py": {
        "test_every_real_client_gets_a_pooled_container_on_both_endpoints": (
            "which clients a pooled container serves (the orchestrator's matching); pooled "
            "containers on Podman: the other tests here"
        ),
    },
}


def docker_only_reason(module: str, function: str) -> str | None:
    """Why the test ``function`` of the module file ``module`` runs on Docker only, or None
    when it runs on Podman too."""
    return DOCKER_ONLY_MODULES.get(module) or DOCKER_ONLY_TESTS.get(module, {}).get(function)
