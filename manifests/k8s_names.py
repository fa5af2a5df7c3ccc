"""Kubernetes name and value formats, as apimachinery checks them. Pure functions.

Each returns the list of problems (empty when valid), worded as upstream words them, so a
fake API server can answer with the apiserver's own text. Upstream:
kubernetes/apimachinery ``pkg/util/validation/validation.go`` (k8s 1.33 line, v0.33.0) and
``pkg/api/resource/quantity.go`` for quantities.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + ")*"
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
# The JobSet CRD's pattern for every resource quantity (controller-gen's Quantity schema).
QUANTITY_FMT = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")

_full = re.compile


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.go: RegexError."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    eg = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {eg}regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    """validation.go: MaxLenError."""
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    """validation.go: IsDNS1123Label."""
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not _full(DNS1123_LABEL_FMT).fullmatch(value):
        errs.append(_regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character", DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    """validation.go: IsDNS1123Subdomain."""
    errs = [max_len_error(253)] if len(value) > 253 else []
    if not _full(DNS1123_SUBDOMAIN_FMT).fullmatch(value):
        errs.append(_regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character", DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def is_dns1035_label(value: str) -> list[str]:
    """validation.go: IsDNS1035Label."""
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not _full(DNS1035_LABEL_FMT).fullmatch(value):
        errs.append(_regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character", DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errs


def is_qualified_name(value: str) -> list[str]:
    """validation.go: IsQualifiedName (label keys, annotation keys, resource names)."""
    parts = value.split("/")
    errs: list[str] = []
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + m for m in is_dns1123_subdomain(prefix)]
    else:
        return [_regex_error("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
                             "must start and end with an alphanumeric character", QUALIFIED_NAME_FMT,
                             "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + max_len_error(63))
    if not _full(QUALIFIED_NAME_FMT).fullmatch(name):
        errs.append("name part " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character", QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def is_valid_label_value(value: str) -> list[str]:
    """validation.go: IsValidLabelValue."""
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not _full(LABEL_VALUE_FMT).fullmatch(value):
        errs.append(_regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character", LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def is_env_var_name(value: str) -> list[str]:
    """validation.go: IsEnvVarName, the rule with RelaxedEnvironmentVariableValidation off.

    That gate is beta (on by default) from 1.32 and relaxes names to any printable ASCII but
    '='; this keeps the stricter rule so a manifest passes on every cluster version xrun
    targets (GKE still serves 1.31)."""
    errs = []
    if not _full(ENV_VAR_NAME_FMT).fullmatch(value):
        errs.append(_regex_error(
            "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', "
            "and must not start with a digit", ENV_VAR_NAME_FMT, "my.env-name", "MY_ENV.NAME", "MyEnvName1"))
    if value == ".":
        errs.append("must not be '.'")
    elif value == "..":
        errs.append("must not be '..'")
    elif value.startswith(".."):
        errs.append("must not start with '..'")
    return errs


def is_valid_port_num(port: object) -> list[str]:
    """validation.go: IsValidPortNum."""
    ok = isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535
    return [] if ok else ["must be between 1 and 65535, inclusive"]


def is_valid_port_name(port: str) -> list[str]:
    """validation.go: IsValidPortName (IANA_SVC_NAME)."""
    errs = []
    if len(port) > 15:
        errs.append(max_len_error(15))
    if not re.fullmatch("[-a-z0-9]+", port):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", port):
        errs.append("must contain at least one letter (a-z)")
    if "--" in port:
        errs.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def parse_quantity(value: object) -> Decimal | None:
    """A resource quantity's exact value (quantity.go: ParseQuantity), or None if it is not one.

    JSON ints are quantities too (the CRD types them int-or-string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if not isinstance(value, str) or not re.fullmatch(QUANTITY_FMT, value):
        return None
    m = re.fullmatch(r"([+-]?[0-9.]+)((?:[KMGTPE]i)|[numkMGTPE]|(?:[eE][+-]?[0-9.]+))?", value)
    if not m:
        return None
    try:
        number = Decimal(m[1])
        suffix = m[2] or ""
        if suffix[:1] in ("e", "E"):
            return number * (Decimal(10) ** Decimal(suffix[1:]))
        return number * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None
