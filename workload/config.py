"""Training configuration: one flat dataclass, named presets, ``key=value`` overrides, YAML.

Importing this module must stay cheap and jax-free: the orchestrator's CLI validates a run
spec's workload arguments with :func:`parse_overrides` / :func:`load_config` before anything
is submitted. Every error is a ``ValueError`` that names the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

# auto: the fastest policy whose compiled step fits the device's memory, micro-batches where
# none does (workload.autotune); none on CPU.
REMAT_POLICIES = ("auto", "none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16")
TOKEN_DTYPES = ("uint16", "uint32")
# auto: splash on TPU, cudnn on GPU (bf16), einsum on CPU (workload.attention.resolve).
ATTENTION_KERNELS = ("auto", "einsum", "xla", "cudnn", "splash")
# How the embedding table's AdamW update gets its gradient (workload.train.embedding_route):
# sparse (the looked-up rows only; auto off TPU), dense (a [vocab, d] scatter-add, then
# optax; auto on TPU).
EMBEDDING_UPDATES = ("auto", "sparse", "dense")
# Whether the first steps run a quickly compiled train step (XLA's lowest execution-time
# effort) while the optimized one compiles beside them (workload.train): auto on TPU when the
# step is compiled from scratch; off keeps every step on the optimized executable.
QUICK_COMPILE = ("auto", "on", "off")
CHOICES = {"param_dtype": DTYPES, "compute_dtype": DTYPES, "remat": REMAT_POLICIES,
           "data_dtype": TOKEN_DTYPES, "attention": ATTENTION_KERNELS,
           "embedding_update": EMBEDDING_UPDATES, "quick_compile": QUICK_COMPILE}


@dataclass(frozen=True)
class Config:
    """Everything that decides what is trained; ``steps`` are counted 1..steps."""

    preset: str = "tiny"
    # Model: a llama-style decoder.
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    mlp_dim: int = 128
    seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "auto"  # one of REMAT_POLICIES, applied to every scanned layer
    # Gradient accumulation: the global batch runs as this many micro-batches, one optimizer
    # update (remat=auto raises it where no policy fits the whole batch).
    micro_batches: int = 1
    # Layers per iteration of the layer scan (lax.scan's unroll); 0: all of them, a straight
    # program (on CPU a small model's backward spends a third of its time stacking per-layer
    # residuals and gradients in the loop; a longer compile in exchange).
    scan_unroll: int = 1
    attention: str = "auto"  # one of ATTENTION_KERNELS
    # Splash attention's query and key/value block (forward and backward): a multiple of 128;
    # a block longer than the sequence is cut to it.
    splash_block: int = 512
    embedding_update: str = "auto"  # one of EMBEDDING_UPDATES
    # Batch: global_batch > 0 fixes it; 0 means batch_per_device x devices.
    global_batch: int = 8
    batch_per_device: int = 1
    # Optimiser: AdamW, linear warmup then cosine decay to min_lr_ratio x learning_rate.
    steps: int = 20
    learning_rate: float = 1e-2
    warmup_steps: int = 2
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    adam_b1: float = 0.9
    adam_b2: float = 0.95
    grad_clip: float = 1.0
    z_loss: float = 0.0
    seed: int = 0
    # Data: "synthetic" or a flat binary token file (local path or gs://).
    data: str = "synthetic"
    data_dtype: str = "uint16"
    # Checkpoints: every K steps and at the last step; 0 turns saving off.
    checkpoint_every: int = 10
    max_to_keep: int = 3
    async_checkpoint: bool = True
    # Device memory (GiB per device) a save may copy part of the state into, so that only the
    # rest is copied to the host before training goes on (workload.checkpointing.Staging):
    # -1 what the train step leaves free (none on CPU), 0 off.
    checkpoint_stage_gib: float = -1.0
    # Threads that copy the rest to the host before save returns (Orbax copies one array after
    # another: 1.7 GB/s on a v5e chip's link, 2.85 GB/s from 4 threads); 0: Orbax's own copy.
    checkpoint_copy_threads: int = 4
    quick_compile: str = "auto"  # one of QUICK_COMPILE
    # "START:STEPS": a jax.profiler trace of those steps into <root>/runs/<name>/profile/
    # (workload.profiling); "" none.
    profile: str = ""

    @property
    def params_count(self) -> int:
        """Exact parameter count (embedding, layers, final norm, untied output)."""
        d, hd = self.d_model, self.head_dim
        attn = d * hd * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * d * self.mlp_dim
        layer = attn + mlp + 2 * d
        return 2 * self.vocab_size * d + self.n_layers * layer + d

    def batch_size(self, devices: int) -> int:
        return self.global_batch if self.global_batch > 0 else self.batch_per_device * devices

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict[str, Any]] = {
    # Seconds on a CPU; fp32 compute so that topologies agree to 1e-5.
    "tiny": {},
    # The benchmark model: ~21M parameters, one CPU device, batch 1.
    "bench-21m": dict(
        vocab_size=32000, d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=64,
        mlp_dim=1024, seq_len=256, global_batch=0, batch_per_device=1,
        compute_dtype="bfloat16", learning_rate=1e-3, warmup_steps=10, steps=50,
        checkpoint_every=0, scan_unroll=0,
    ),
    # The seed model: 1.104 billion parameters.
    "1b": dict(
        vocab_size=32000, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=16, head_dim=128,
        mlp_dim=7168, seq_len=2048, global_batch=0, batch_per_device=1,
        compute_dtype="bfloat16", learning_rate=3e-4, warmup_steps=100,
        steps=1000, checkpoint_every=200, scan_unroll=0,
    ),
}

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _allowed_keys() -> str:
    return ", ".join(k for k in _FIELDS if k != "preset")


def _convert(key: str, value: Any) -> Any:
    """Turn a string (CLI) or YAML scalar into the field's type, or raise naming the field."""
    kind = type(getattr(Config(), key))
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"workload config {key}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool):
            raise ValueError(f"workload config {key}: expected an integer, got {value!r}")
        try:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return int(str(value).strip())
        except ValueError:
            raise ValueError(f"workload config {key}: expected an integer, got {value!r}") from None
    if kind is float:
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"workload config {key}: expected a number, got {value!r}") from None
        if not math.isfinite(out):
            raise ValueError(f"workload config {key}: expected a finite number, got {value!r}")
        return out
    if key in CHOICES and str(value) not in CHOICES[key]:
        raise ValueError(f"workload config {key}: unknown {value!r}; allowed: {', '.join(CHOICES[key])}")
    return str(value)


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["steps=20", "remat=full"]`` -> typed dict; unknown keys and bad values raise."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"workload config: expected key=value, got {item!r}")
        out.update(check_values({key: value}))
    return out


def check_values(values: dict[str, Any]) -> dict[str, Any]:
    """Typed copy of ``values``; unknown keys raise with the list of allowed keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key == "preset":
            check_preset(str(value))
            out[key] = str(value)
            continue
        if key not in _FIELDS:
            from xrun_contract.errors import did_you_mean

            raise ValueError(f"workload config: unknown key {key!r}{did_you_mean(key, _allowed_keys().split(', '))}; "
                             f"allowed: {_allowed_keys()}")
        out[key] = _convert(key, value)
    return out


def check_preset(name: str) -> str:
    if name not in PRESETS:
        raise ValueError(f"workload config preset: unknown {name!r}; allowed: {', '.join(PRESETS)}")
    return name


def validate(cfg: Config) -> Config:
    """Cross-field checks that would otherwise fail deep inside jax."""
    check_preset(cfg.preset)
    positive = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                "mlp_dim", "seq_len", "steps", "batch_per_device", "max_to_keep", "micro_batches")
    for key in positive:
        if getattr(cfg, key) < 1:
            raise ValueError(f"workload config {key}: must be >= 1, got {getattr(cfg, key)}")
    for key in ("global_batch", "warmup_steps", "checkpoint_every", "scan_unroll"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"workload config {key}: must be >= 0, got {getattr(cfg, key)}")
    if cfg.n_heads % cfg.n_kv_heads:
        raise ValueError(f"workload config n_kv_heads: must divide n_heads={cfg.n_heads}, "
                         f"got {cfg.n_kv_heads}")
    if cfg.head_dim % 2:
        raise ValueError(f"workload config head_dim: must be even (rotary), got {cfg.head_dim}")
    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise ValueError(f"workload config {key}: unknown {getattr(cfg, key)!r}; "
                             f"allowed: {', '.join(allowed)}")
    if cfg.attention == "splash" and cfg.seq_len % 128:
        raise ValueError("workload config attention: splash needs seq_len a multiple of 128 "
                         f"(its block size), got seq_len={cfg.seq_len}")
    if cfg.splash_block < 128 or cfg.splash_block % 128:
        raise ValueError("workload config splash_block: a multiple of 128 (splash's block "
                         f"unit), got {cfg.splash_block}")
    if cfg.attention == "cudnn" and (cfg.compute_dtype != "bfloat16" or cfg.head_dim % 8
                                     or cfg.head_dim > 128):
        raise ValueError("workload config attention: cudnn needs compute_dtype=bfloat16 and "
                         f"head_dim a multiple of 8 up to 128, got {cfg.compute_dtype}, "
                         f"head_dim={cfg.head_dim}")
    if cfg.checkpoint_stage_gib < 0 and cfg.checkpoint_stage_gib != -1:
        raise ValueError("workload config checkpoint_stage_gib: -1 (auto), 0 (off) or a size "
                         f"in GiB, got {cfg.checkpoint_stage_gib}")
    if not 0 <= cfg.checkpoint_copy_threads <= 64:
        raise ValueError("workload config checkpoint_copy_threads: 0 (Orbax's own copy) to 64, "
                         f"got {cfg.checkpoint_copy_threads}")
    parse_profile(cfg.profile)
    if cfg.learning_rate <= 0:
        raise ValueError(f"workload config learning_rate: must be > 0, got {cfg.learning_rate}")
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise ValueError(f"workload config min_lr_ratio: must be in [0, 1], got {cfg.min_lr_ratio}")
    if cfg.data_dtype == "uint16" and cfg.vocab_size > 65536 and cfg.data != "synthetic":
        raise ValueError("workload config data_dtype: uint16 tokens cannot index "
                         f"vocab_size={cfg.vocab_size}; use uint32")
    return cfg


def parse_profile(spec: str) -> tuple[int, int] | None:
    """``"START:STEPS"`` -> (first step, how many); "" -> None. A ValueError names the field."""
    if not spec:
        return None
    start, sep, steps = spec.partition(":")
    try:
        out = (int(start), int(steps)) if sep else None
    except ValueError:
        out = None
    if out is None or out[0] < 1 or out[1] < 1:
        raise ValueError("workload config profile: expected START:STEPS (step numbers >= 1, "
                         f"e.g. 5:3), got {spec!r}")
    return out


def load_config(preset: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                yaml_text: str | None = None) -> Config:
    """Preset (flag, else the YAML's ``preset``, else tiny), then YAML keys, then overrides."""
    from_yaml: dict[str, Any] = {}
    if yaml_text:
        import yaml

        loaded = yaml.safe_load(yaml_text) or {}
        if not isinstance(loaded, dict):
            raise ValueError("workload config file: expected a mapping of key: value")
        from_yaml = check_values(loaded)
    from_cli = parse_overrides(overrides)
    name = check_preset(preset or from_cli.pop("preset", None) or from_yaml.get("preset") or "tiny")
    values: dict[str, Any] = {**PRESETS[name], **from_yaml, **from_cli, "preset": name}
    return validate(Config(**values))


def arg_parser(exit_on_error: bool = False):
    """The command line of ``python -m workload.train`` (used by train and by the
    orchestrator's pre-submit check, which must not import jax)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m workload.train", exit_on_error=exit_on_error,
                                description="Train xrun's llama-style model with JAX.")
    p.add_argument("--config", help="YAML file of config keys (and optionally preset: NAME)")
    p.add_argument("--preset", help="named preset: tiny, bench-21m, 1b (default tiny)")
    p.add_argument("--storage", help="storage root (folder or gs://); overrides XRUN_STORAGE")
    p.add_argument("--run-name", help="run name; overrides XRUN_RUN_NAME")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return p


def check_command_args(args: list[str], devices: int) -> Config | None:
    """Validate ``python -m workload.train ARGS`` for ``devices`` devices in all, before
    anything is submitted. The Config, or None when a --config file (only in the image)
    decides part of it; every problem is a ValueError naming the field."""
    import argparse

    parser = arg_parser()
    try:
        ns, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError as e:
        raise ValueError(f"workload arguments: {e}") from None
    if unknown:
        raise ValueError(f"workload arguments: unknown option {unknown[0]!r}; allowed: "
                         "--config, --preset, --storage, --run-name, key=value")
    if ns.config:
        if ns.preset:
            check_preset(ns.preset)
        parse_overrides(ns.overrides)
        return None
    cfg = load_config(ns.preset, ns.overrides)
    batch = cfg.batch_size(devices)
    # Only a batch the user chose is held against the shape: the default command's preset
    # batch is what every rendered example starts from.
    chosen = any(o.partition("=")[0].strip() == "global_batch" for o in ns.overrides)
    if chosen and batch % devices:
        raise ValueError(f"workload config global_batch: {batch} does not split over {devices} "
                         f"devices; use a multiple of {devices} (or 0 for batch_per_device x devices)")
    return cfg


def describe(cfg: Config) -> str:
    """The whole config as one line of JSON (the header's config value)."""
    return json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))



def step_flops(cfg: Config, global_batch: int, devices: int) -> dict[str, float]:
    """Training FLOPs of one step (forward + backward = 3 x forward), MaxText's accounting:
    learnable-weight matmuls plus causal attention (half of the S x S scores)."""
    b, s, d, hd = global_batch, cfg.seq_len, cfg.d_model, cfg.head_dim
    per_layer = 2 * b * s * d * (3 * cfg.mlp_dim + (cfg.n_heads + 2 * cfg.n_kv_heads) * hd
                                 + cfg.n_heads * hd)
    learnable = cfg.n_layers * per_layer + 2 * b * s * d * cfg.vocab_size
    attention = cfg.n_layers * 4 * b * s * s * cfg.n_heads * hd / 2
    total = 3 * (learnable + attention) / 1e12
    return {
        "tflops_per_step": total,
        "tflops_per_device": total / devices,
        "learnable_pct": 100 * learnable / (learnable + attention),
        "attention_pct": 100 * attention / (learnable + attention),
    }
