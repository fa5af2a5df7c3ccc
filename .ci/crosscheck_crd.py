"""Cross-check: every shape x slices x options renders a JobSet the upstream CRD accepts.

Run by .ci/run when ../shared/schemas (the upstream JobSet CRD, kubernetes-sigs/jobset
config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml) is beside the checkout. The
tests do not need it: they check the typed model and offline admission instead.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from manifests import catalogue  # noqa: E402
from manifests.jobset import jobset  # noqa: E402
from manifests.spec import build_spec  # noqa: E402

OPTIONS = [
    {},
    {"service_account": "trainer", "priority_class": "high", "queue": "team-a", "kueue_priority": "prod",
     "privileged": True, "max_restarts": 0, "env": {"A": "$x", "EMPTY": ""}},
    {"queue": "lq", "capacity": "flex-start", "priority": "high", "node_selector": {"example.com/pool": "a"},
     "tolerations": [{"key": "d", "operator": "Equal", "value": "x", "effect": "NoExecute", "toleration_seconds": 30}],
     "pod_labels": {"team": "ml"}, "pod_annotations": {"example.com/o": "a"},
     "mounts": [{"bucket": "data-b", "path": "/data", "read_only": True}, {"pvc": "ds", "path": "/ds"}],
     "scheduler": "gke.io/topology-aware-auto", "kueue_topology": "required:cloud.google.com/gce-topology-block"},
]


def main(crd_path: Path) -> int:
    crd = yaml.load(crd_path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)(schema)
    names = sorted(catalogue.shapes()) + ["cpu-2"]
    checked = 0
    for name, options in itertools.product(names, OPTIONS):
        kind = catalogue.lookup(name).kind
        for count in (1, 2):
            values = {"name": "crosscheck", "accelerator": name, "image": "img:1", "storage": "gs://xrun-bucket/x",
                      **options}
            if kind != "gpu":
                values.pop("scheduler", None)  # gke.io/topology-aware-auto: GPU shapes only, as xpk
            if kind == "tpu":
                values["num_slices"] = count
            elif kind == "gpu":
                values["nodes"] = count
            elif count > 1:
                continue
            try:
                obj = jobset(build_spec(values, {}))
            except Exception as e:  # noqa: BLE001 - a shape the spec refuses (e.g. multislice) is fine
                if "num_slices" in str(e) or "nodes" in str(e) or "capacity" in str(e):
                    continue
                raise
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
            if errors:
                e = errors[0]
                print(f"CRD cross-check: {name} x{count} {sorted(options)}: "
                      f"{'/'.join(map(str, e.path))}: {e.message}", file=sys.stderr)
                return 1
            checked += 1
    print(f"CRD cross-check: {checked} rendered JobSets valid against {crd_path}")
    return 0


if __name__ == "__main__":
    default = REPO.parent / "shared" / "schemas" / "jobset.x-k8s.io_jobsets.yaml"
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    sys.exit(main(path))
