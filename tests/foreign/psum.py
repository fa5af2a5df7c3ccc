"""A JAX program that knows nothing of xrun: it reads only the contract env every pod gets
(JAX_COORDINATOR_ADDRESS is read by jax.distributed.initialize itself; XRUN_NUM_PROCESSES
and XRUN_PROCESS_ID, the latter computed by xrun's launcher) and sums one number per
process across hosts. Exits with $PSUM_EXIT (default 0) so a test can read a code back."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(num_processes=int(os.environ["XRUN_NUM_PROCESSES"]),
                           process_id=int(os.environ["XRUN_PROCESS_ID"]))
me = jax.process_index()
total = multihost_utils.process_allgather(jnp.array([me + 1.0])).sum()
xrun = sorted({m.split(".")[0] for m in sys.modules}
              & {"workload", "xrun_contract", "orchestrator", "manifests"})
print(f"psum: process {me} of {jax.process_count()} total {float(np.asarray(total)):g} "
      f"xrun modules {xrun}", flush=True)
jax.distributed.shutdown()
sys.exit(int(os.environ.get("PSUM_EXIT", "0")))
