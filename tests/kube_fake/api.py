"""The Kubernetes API conventions the fake speaks, without I/O: ``metav1.Status`` errors and
their field causes, label and field selectors, resource quantities and timestamps.

Messages are worded as kube-apiserver words them (``pods "x" not found``, ``Pod "x" is invalid:
spec.containers[0].image: Required value``), so that a client's error handling meets what it
will meet in a cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Final

DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUANTITY: Final = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eEinumkKMGTP]*[-+]?[0-9]*)"
)
_EXPONENT: Final = re.compile(r"[eE]([-+]?[0-9]+)")
_SUFFIXES: Final = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
DNS1123_SUBDOMAIN_MESSAGE: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1123_LABEL_MESSAGE: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
LABEL_VALUE_MESSAGE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def timestamp(moment: datetime | None = None) -> str:
    """A ``metav1.Time`` as the API serializes it: RFC 3339, UTC, whole seconds."""
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def docker_time(text: str | None) -> str | None:
    """Docker's nanosecond timestamp (``2024-05-01T12:00:00.123456789Z``) as a ``metav1.Time``;
    None for Docker's zero time (never started or never finished)."""
    if not text or text.startswith("0001-"):
        return None
    return text.split(".", 1)[0].rstrip("Z") + "Z"


def go_repr(value: object) -> str:
    """A value as field errors quote it (strings in double quotes, numbers bare)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


# --- metav1.Status ---------------------------------------------------------------------------


class ApiError(Exception):
    """A request refused with a ``metav1.Status`` (kind Status, status Failure)."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details) if details else None

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details:
        status["details"] = dict(details)
    status["code"] = code
    return status


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def already_exists(name: str, resource: str = "pods") -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{resource} "{name}" already exists',
        {"name": name, "kind": resource},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


UNAUTHORIZED: Final = ApiError(401, "Unauthorized", "Unauthorized")
UNKNOWN_PATH: Final = ApiError(
    404,
    "NotFound",
    "the server could not find the requested resource",
    {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
)
METHOD_NOT_ALLOWED: Final = ApiError(
    405,
    "MethodNotAllowed",
    "the server does not allow this method on the requested resource",
)


# --- field errors (422 Invalid) --------------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """One ``field.Error``: its type (as the Status cause's reason), field path and message."""

    reason: str
    field: str
    message: str

    def text(self) -> str:
        return f"{self.field}: {self.message}"


def required(field: str) -> Cause:
    return Cause("FieldValueRequired", field, "Required value")


def invalid_value(field: str, value: object, detail: str) -> Cause:
    return Cause("FieldValueInvalid", field, f"Invalid value: {go_repr(value)}: {detail}")


def forbidden(field: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", field, f"Forbidden: {detail}")


def unsupported(field: str, value: object, supported: Iterable[str]) -> Cause:
    values = ", ".join(f'"{item}"' for item in supported)
    return Cause(
        "FieldValueNotSupported",
        field,
        f"Unsupported value: {go_repr(value)}: supported values: {values}",
    )


def field_not_found(field: str, value: object) -> Cause:
    return Cause("FieldValueNotFound", field, f"Not found: {go_repr(value)}")


def duplicate(field: str, value: object) -> Cause:
    return Cause("FieldValueDuplicate", field, f"Duplicate value: {go_repr(value)}")


def invalid(name: str, causes: list[Cause], kind: str = "Pod") -> ApiError:
    """422: what ``apierrors.NewInvalid`` makes of an object's field errors."""
    listed = causes[0].text() if len(causes) == 1 else f"[{', '.join(c.text() for c in causes)}]"
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {listed}',
        {
            "name": name,
            "kind": kind,
            "causes": [
                {"reason": cause.reason, "message": cause.message, "field": cause.field}
                for cause in causes
            ],
        },
    )


def label_key_errors(field: str, key: str) -> list[Cause]:
    """A label key: an optional DNS subdomain prefix and ``/``, then a name of at most 63."""
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        problems.append(f"prefix part {DNS1123_SUBDOMAIN_MESSAGE}")
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        problems.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
            "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
            "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return [invalid_value(field, key, problem) for problem in problems]


def label_value_ok(value: object) -> bool:
    return isinstance(value, str) and (
        value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)
    )


# --- selectors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One requirement of a label selector: ``op`` is =, !=, in, notin, exists or !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # != and notin also match objects without the label, as in Kubernetes.
        return not present or value not in self.values


_SET_REQUIREMENT: Final = re.compile(r"\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*")
_EQUALITY: Final = re.compile(r"\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*")
_EXISTS: Final = re.compile(r"\s*(!?)\s*([^\s!=(),]+)\s*")


def parse_label_selector(text: str) -> list[Requirement]:
    """``a=b,c!=d,e,!f,g in (h,i),j notin (k)``. Error handling: 400 BadRequest."""
    requirements: list[Requirement] = []
    for part in _split_outside_parentheses(text):
        if not part.strip():
            continue
        requirements.append(_requirement(part))
    return requirements


def _requirement(part: str) -> Requirement:
    if found := _SET_REQUIREMENT.fullmatch(part):
        key, op, listed = found.groups()
        values = frozenset(v.strip() for v in listed.split(",") if v.strip())
        requirement = Requirement(key, op, values)
    elif found := _EQUALITY.fullmatch(part):
        key, op, value = found.groups()
        requirement = Requirement(key, "!=" if op == "!=" else "=", frozenset({value}))
    elif found := _EXISTS.fullmatch(part):
        bang, key = found.groups()
        requirement = Requirement(key, "!exists" if bang else "exists")
    else:
        raise bad_request(f"unable to parse requirement: found '{part.strip()}'")
    if label_key_errors("key", requirement.key):
        raise bad_request(
            f'unable to parse requirement: values[0][key]: Invalid value: "{requirement.key}": '
            "name part must consist of alphanumeric characters, '-', '_' or '.'"
        )
    for value in requirement.values:
        if not label_value_ok(value):
            raise bad_request(
                f"unable to parse requirement: values[0][{requirement.key}]: Invalid value: "
                f'"{value}": {LABEL_VALUE_MESSAGE}'
            )
    return requirement


def _split_outside_parentheses(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


# The fields a pod list can be selected by (the pod strategy's PodToSelectableFields).
POD_FIELDS: Final = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.restartPolicy": ("spec", "restartPolicy"),
    "spec.schedulerName": ("spec", "schedulerName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.phase": ("status", "phase"),
    "status.podIP": ("status", "podIP"),
    "status.nominatedNodeName": ("status", "nominatedNodeName"),
}
# A Secret's (the secret strategy's SelectableFields: the object meta's, and its type).
SECRET_FIELDS: Final = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "type": ("type",),
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    equal: bool
    path: tuple[str, ...] = ()  # where the field is in the object (default: a pod's)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        found: Any = obj
        for key in self.path or POD_FIELDS[self.field]:
            found = found.get(key) if isinstance(found, Mapping) else None
        actual = str(found or "")
        return (actual == self.value) == self.equal


def parse_field_selector(
    text: str, fields: Mapping[str, tuple[str, ...]] = POD_FIELDS
) -> list[FieldRequirement]:
    """``metadata.name=x,status.phase!=Running``, over ``fields`` (a resource's selectable
    fields). Error handling: 400 BadRequest."""
    requirements = []
    for part in text.split(","):
        if not part.strip():
            continue
        found = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if found is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = found.groups()
        if field not in fields:
            raise bad_request(f"field label not supported: {field}")
        requirements.append(FieldRequirement(field, value, op != "!=", tuple(fields[field])))
    return requirements


# --- quantities ------------------------------------------------------------------------------


def parse_quantity(value: object) -> Decimal:
    """A ``resource.Quantity`` (``500m``, ``1.5Gi``, ``64Mi``, ``1e3``, or a JSON number).

    Error handling: raises ValueError with the API's message for anything else.
    """
    message = (
        "quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(message)  # noqa: TRY004 - the API's error for a value it cannot parse
    text = str(value)
    found = _QUANTITY.fullmatch(text)
    if found is None:
        raise ValueError(message)
    number, suffix = found.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation as exc:
        raise ValueError(message) from exc
    if suffix in _SUFFIXES:
        return amount * _SUFFIXES[suffix]
    if exponent := _EXPONENT.fullmatch(suffix):
        return amount * Decimal(10) ** int(exponent.group(1))
    raise ValueError(message)


def ceil_int(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))
