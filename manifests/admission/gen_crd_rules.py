"""Write ``manifests/admission/crd_rules.py`` from the upstream JobSet CRD.

    python -m manifests.admission.gen_crd_rules [CRD]          # rewrite crd_rules.py
    python -m manifests.admission.gen_crd_rules --check [CRD]  # exit 1 if it differs

CRD: kubernetes-sigs/jobset ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml``
(CI keeps a copy in ../shared/schemas; that is the default). The rules are read from the
``v1alpha2`` version's ``openAPIV3Schema`` below ``spec``, leaving out the subtrees that are
Kubernetes core types embedded in the JobSet (a replicatedJob's Job ``template``, a
volumeClaimPolicy's PVC ``templates``): their rules are kube-apiserver's and stay hand-written
in ``manifests.admission.jobs``. tests/test_admission_crd.py checks that the committed module
is what this writes.
"""

from __future__ import annotations

import pprint
import sys
from pathlib import Path
from typing import Any

CRD_SOURCE = "kubernetes-sigs/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
VERSION = "v1alpha2"
MODULE = Path(__file__).with_name("crd_rules.py")
DEFAULT_CRD = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "jobset.x-k8s.io_jobsets.yaml"
# Core types embedded in the JobSet (schema path, "[]" for each item of a list).
CORE_SUBTREES = ("spec.replicatedJobs[].template", "spec.volumeClaimPolicies[].templates")
# Schema keywords -> the table each lands in.
_SCALARS = {"enum": "ENUMS", "minimum": "MINIMUMS", "maximum": "MAXIMUMS", "maxLength": "MAX_LENGTHS",
            "minLength": "MIN_LENGTHS", "pattern": "PATTERNS", "maxItems": "MAX_ITEMS", "minItems": "MIN_ITEMS",
            "default": "DEFAULTS"}
_DOCS = {
    "ENUMS": "allowed values of a string field",
    "MINIMUMS": "an integer field's minimum",
    "MAXIMUMS": "an integer field's maximum",
    "MAX_LENGTHS": "a string field's maximum length",
    "MIN_LENGTHS": "a string field's minimum length",
    "PATTERNS": "a string field's regular expression",
    "MAX_ITEMS": "a list's maximum length",
    "MIN_ITEMS": "a list's minimum length",
    "DEFAULTS": "what the apiserver sets when a field is absent (structural defaulting)",
    "REQUIRED": "an object's required fields",
    "LIST_MAP_KEYS": "a list of objects unique by these keys (x-kubernetes-list-type: map)",
    "INT32": "integer fields of format int32",
    "CEL": ("x-kubernetes-validations on create: (rule, message); rules on oldSelf (updates only) "
            "are left out"),
}


def rules(crd: dict[str, Any]) -> dict[str, Any]:
    """The tables, each keyed by schema path (``spec.replicatedJobs[].dependsOn[].status``)."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    tables: dict[str, dict[str, Any]] = {name: {} for name in _DOCS}

    def walk(node: dict[str, Any], path: str) -> None:
        if path in CORE_SUBTREES:
            return
        for key, table in _SCALARS.items():
            if key in node:
                value = node[key]
                tables[table][path] = tuple(value) if isinstance(value, list) else value
        if node.get("required"):
            tables["REQUIRED"][path] = tuple(node["required"])
        if node.get("x-kubernetes-list-type") == "map":
            tables["LIST_MAP_KEYS"][path] = tuple(node["x-kubernetes-list-map-keys"])
        if node.get("format") == "int32":
            tables["INT32"][path] = True
        cel = tuple((v["rule"], v.get("message", "")) for v in node.get("x-kubernetes-validations", ())
                    if "oldSelf" not in v["rule"])
        if cel:
            tables["CEL"][path] = cel
        for name, sub in sorted(node.get("properties", {}).items()):
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(version["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")
    out: dict[str, Any] = dict(tables)
    out["INT32"] = tuple(sorted(tables["INT32"]))
    return out


def render(crd: dict[str, Any]) -> str:
    """The module's text."""
    gen = crd.get("metadata", {}).get("annotations", {}).get("controller-gen.kubebuilder.io/version", "?")
    lines = [
        f'"""The JobSet CRD\'s own rules ({VERSION} openAPIV3Schema), as data. Generated: do not edit.',
        "",
        f"Source: {CRD_SOURCE}",
        f"(API {crd['spec']['group']}/{VERSION}, controller-gen {gen}), by",
        "``python -m manifests.admission.gen_crd_rules``. Paths are schema paths from the JobSet's",
        "root, ``[]`` standing for each item of a list. Left out: the Kubernetes core types the",
        "JobSet embeds (" + ", ".join(CORE_SUBTREES) + "),",
        "whose rules are kube-apiserver's (hand-written in manifests.admission.jobs).",
        "",
        "Hand-written elsewhere, being no part of this CRD: object metadata (apiserver.py,",
        "apimachinery objectmeta.go), the Job and pod templates' batch and core validation",
        "(jobs.py), the mutating webhook's Go decoding of int32 fields and quantities",
        "(apiserver.py), JobSet's validating webhook (webhook.py) and Kueue (kueue.py). The",
        "CEL rules here are evaluated by apiserver.CEL_CHECKS, one Python check per rule.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        f"SOURCE = {CRD_SOURCE!r}",
        f"VERSION = {VERSION!r}",
    ]
    types = {"INT32": "tuple[str, ...]", "CEL": "dict[str, tuple[tuple[str, str], ...]]",
             "REQUIRED": "dict[str, tuple[str, ...]]", "LIST_MAP_KEYS": "dict[str, tuple[str, ...]]",
             "ENUMS": "dict[str, tuple[str, ...]]", "PATTERNS": "dict[str, str]", "DEFAULTS": "dict[str, Any]"}
    for name, table in rules(crd).items():
        lines += ["", f"# {_DOCS[name]}"]
        kind = types.get(name, "dict[str, int]")
        if not table:
            lines.append(f"{name}: {kind} = {table!r}")
            continue
        lines.append(f"{name}: {kind} = " + ("(" if isinstance(table, tuple) else "{"))
        for key in sorted(table):
            head = f"    {key!r}" + ("" if isinstance(table, tuple) else ": ")
            if isinstance(table, dict):
                text = pprint.pformat(table[key], width=116 - len(head))
                head += text.replace("\n", "\n" + " " * len(head))
            lines.append(head + ",")
        lines.append(")" if isinstance(table, tuple) else "}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import yaml

    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    path = Path(args[0]) if args else DEFAULT_CRD
    if not path.is_file():
        print(f"gen_crd_rules: no CRD at {path}; name the upstream {Path(CRD_SOURCE).name}", file=sys.stderr)
        return 2
    text = render(yaml.safe_load(path.read_text()))
    if check:
        same = MODULE.read_text() == text
        print(f"{MODULE.name}: {'up to date' if same else 'differs from what ' + str(path) + ' makes'}")
        return 0 if same else 1
    MODULE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
