"""xrun's init step and log shipper without an image of xrun's: the bootstrap they run.

With ``xrun_image`` unset, a cluster run's ``xrun-init`` and ``xrun-logs`` containers (and
doctor's probe pod) run a public python image (``xrun_python_image``, default Docker Hub's
official ``python:3.12-slim``), which holds nothing of xrun's. Their command is
``python3 -I -u -c BOOTSTRAP ARGS``: this standard-library script fetches xrun's pod code
(``Layout.pod_code(sha)``, a zip of ``xrun_contract`` and the pod side of ``workload``,
standard library only, uploaded by the submit as ``--workdir`` is) from the run's storage,
checks its sha256 against the manifest's ``XRUN_POD_CODE_SHA256``, unpacks it into
``$XRUN_POD_DIR/lib`` (the pod's emptyDir, so the log shipper and a restarted container find
it there) and runs ``workload.sidecar`` with ARGS. Reading storage (gs:// through the GCS
JSON API with a token from the metadata server, or ``STORAGE_EMULATOR_HOST``; a folder root
as a file) and the backoff between tries are ``xrun_contract.gcs_rest``'s, whose source the
bootstrap carries: the same code ``gcs_http`` and the log shipper run. No I/O but reading
that module's source.
"""

from __future__ import annotations

import ast
import inspect

from xrun_contract import Env, Layout, PodFiles, gcs_rest


def _shared_source() -> str:
    """``xrun_contract.gcs_rest`` as the bootstrap runs it: its source without the module
    docstring (the argv stays short), standard library only."""
    source = inspect.getsource(gcs_rest)
    doc = ast.parse(source).body[0]
    assert isinstance(doc, ast.Expr) and doc.end_lineno is not None
    return "\n".join(source.splitlines()[doc.end_lineno:]).strip() + "\n"


# Placeholders are filled from xrun_contract below, so the names cannot drift. No "$(" in
# the text: Kubernetes would expand it (the argv is k8s_escape'd anyway).
_SOURCE = r'''
import hashlib, io, sys, zipfile


def main():
    sha = os.environ["@SHA_ENV@"]
    lib = os.path.join(os.environ.get("@DIR_ENV@") or "@MOUNT@", "@LIB@")
    mark = os.path.join(lib, ".sha256")
    if not (os.path.isfile(mark) and open(mark).read() == sha):
        root, key = os.environ["@STORAGE_ENV@"], "@KEY@".replace("SHA", sha)
        backoff = Backoff(1.0, 30.0, tries=8)
        while True:
            try:
                data = read_object(root, key)
                break
            except Exception as e:
                permanent = getattr(e, "code", 0) in (400, 401, 403, 404) or isinstance(e, FileNotFoundError)
                if permanent or not backoff.can_retry():
                    sys.exit("xrun-boot: cannot fetch xrun's pod code %s/%s: %s" % (root, key, e))
                print("xrun-boot: fetching %s/%s failed (%s); retrying" % (root, key, e), file=sys.stderr, flush=True)
                backoff.sleep()
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit("xrun-boot: %s/%s is not the pod code the manifest names (sha256 differs)" % (root, key))
        zipfile.ZipFile(io.BytesIO(data)).extractall(lib)
        with open(mark, "w") as f:
            f.write(sha)
    sys.path.insert(0, lib)
    from workload.sidecar import main as run
    sys.exit(run(sys.argv[1:]))


main()
'''

_MAIN = (_SOURCE.replace("@SHA_ENV@", Env.POD_CODE_SHA256).replace("@DIR_ENV@", Env.POD_DIR)
         .replace("@MOUNT@", PodFiles.MOUNT_PATH).replace("@LIB@", PodFiles.LIB)
         .replace("@STORAGE_ENV@", Env.STORAGE).replace("@KEY@", Layout.pod_code("SHA")))
# Before the pod code is fetched (seconds; minutes in an outage), as workload.sidecar does
# first when run itself: the log shipper holds SIGTERM pending until its own thread takes it,
# so the workload's end cannot kill it while it starts (workload.sidecar.say_ready). After
# the shared module, whose ``from __future__`` import must come first (stdlib imports only).
_PROLOGUE = ("import signal, sys\n"
             "if sys.argv[1:] == ['ship']:\n"
             "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\n")
BOOTSTRAP = _shared_source() + "\n\n" + _PROLOGUE + _MAIN.strip() + "\n"
assert "$(" not in BOOTSTRAP

# What the zip holds, relative to the repository root (globs): the pod side only, all of it
# standard library (tests/test_public_images.py runs it under ``python3 -I -S``).
POD_CODE_FILES = ("xrun_contract/*.py", "workload/__init__.py", "workload/sidecar.py",
                  "workload/code.py", "workload/probe.py", "workload/launcher.sh")


def boot_argv(*args: str) -> list[str]:
    """A container command running ``workload.sidecar ARGS`` from the fetched pod code."""
    return ["python3", "-I", "-u", "-c", BOOTSTRAP.replace("$", "$$"), *args]
