#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Peak memory per rank of ``ds_gas_check`` beside plain training with the same config, on Llama-shaped models.

For each model size and mode, the parent writes a Llama config (no weights: built from the config) and a
DeepSpeed config, then launches, through the ``deepspeed`` launcher on ``--ranks`` ranks:

- **training**: this file's worker, ``engine(**batch).loss``, ``engine.backward``, ``engine.step`` on the
  check's own token batches, with the first split's micro-batch and GAS, for ``--steps`` steps;
- **check**: ``ds_gas_check --hf-model DIR`` with ``--reference`` or ``--no-reference``;
- **control** (negative control, not a memory figure): the ``--no-reference`` check with a seeded bug, the last
  micro-batch of every accumulated step dropped (``engine.backward`` of a zero loss): every split with GAS > 1
  must FAIL (exit status 1).

A sampler reads the resident memory (RSS) of every process of the launch every 0.5 s; a rank's peak is the
largest RSS one of its worker processes reached (launcher processes are left out: they are the smallest).
The table gives, per size and mode, the peak of the largest rank for the check and for training, their
ratio, both per parameter, and the check's wall time in training steps.

    python benchmarks/gas_check_memory.py --sizes 58m --modes reference,no-reference --dtype fp32
    python benchmarks/gas_check_memory.py --sizes 1b --modes no-reference --zero 3 --offload --steps 2
    python benchmarks/gas_check_memory.py --table gas_check_memory.json       # the markdown table

On a GPU machine the same command measures host memory; ``--device-memory`` is not read (see docs/guides/gas_check.md).
Not a test: figures go to docs/evidence/gas_check.md.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()

from toolkit.ports import free_port
from toolkit import tables

# name -> (hidden, layers, intermediate, heads, vocab)
LLAMA = {
    "58m": (512, 8, 1376, 8, 32000),
    "220m": (1024, 12, 2752, 16, 32000),
    "360m": (1024, 24, 2752, 16, 32000),
    "520m": (1536, 16, 4096, 16, 32000),
    "1b": (2048, 18, 5504, 16, 32000),
}


def parameter_count(hidden, layers, intermediate, heads, vocab):
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    return 2 * vocab * hidden + layers * per_layer + hidden


def write_llama(directory, size):
    hidden, layers, intermediate, heads, vocab = LLAMA[size]
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": vocab,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def ds_config(stage, offload, dtype, clip, bucket_elements=None):
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "SGD",
            "params": {
                "lr": 0.1
            }
        },
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": clip,
        "zero_optimization": {
            "stage": stage
        },
    }
    if bucket_elements:
        # Smaller buffers than DeepSpeed's defaults (5e8-element buckets, 1e9-element sub-groups), as a run whose
        # host memory is tight sets them: the same for training and check.
        config["zero_optimization"].update({
            key: int(bucket_elements)
            for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "sub_group_size",
                        "stage3_max_live_parameters", "stage3_max_reuse_distance")
        })
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False  # torch's SGD on the host
    return config


class Sampler:
    """Peak RSS of each process in the tree under ``root``, sampled every ``period`` seconds."""

    def __init__(self, root, period=0.5):
        import psutil
        self.root, self.period, self.peaks, self.names = psutil.Process(root), period, {}, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import psutil
        while not self.done.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    self.names.setdefault(proc.pid, " ".join(proc.cmdline()[:4]))
                except psutil.Error:
                    continue
                self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), rss)
            time.sleep(self.period)

    def stop(self):
        self.done.set()
        self.thread.join()

    def rank_peaks(self, ranks):
        """The ``ranks`` largest per-process peaks: the workers (launcher processes hold no model)."""
        return sorted(self.peaks.values(), reverse=True)[:ranks]


def measured(command, ranks, env, log):
    start = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        sampler = Sampler(proc.pid)
        code = proc.wait()
        sampler.stop()
    return {
        "exit": code,
        "wall_s": round(time.time() - start, 1),
        "rank_peaks_gib": [round(p / 2**30, 2) for p in sampler.rank_peaks(ranks)]
    }


def launcher(ranks, script_args):
    # A port of its own: another launch on the machine (a test run) may hold the default one.
    return [
        sys.executable, "-m", "deepspeed.launcher.runner", "--master_port",
        str(free_port()), "--num_gpus",
        str(ranks), "--no_local_rank"
    ] + script_args


def run_case(args, size, mode, work):
    model_dir = write_llama(work / f"llama-{size}", size)
    config = ds_config(args.zero, args.offload, args.dtype, args.clip, args.bucket_elements)
    config_path = work / f"ds-{size}.json"
    config_path.write_text(json.dumps(config, indent=1))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    micro, gas = (int(x) for x in args.splits.split(",")[0].split("x"))
    tag = f"{size}-{mode}-z{args.zero}{'-offload' if args.offload else ''}-{args.dtype}"
    if mode == "training":
        command = launcher(args.ranks, [
            str(HERE), "--worker", "--hf-model",
            str(model_dir), "--config",
            str(config_path), "--micro",
            str(micro), "--gas",
            str(gas), "--steps",
            str(args.steps), "--ranks",
            str(args.ranks)
        ])
    else:
        check = ["--module", "deepspeed.gafix.gas_check"] if mode != "control" else [str(HERE), "--control-worker"]
        command = launcher(
            args.ranks, check + [
                "--config",
                str(config_path), "--hf-model",
                str(model_dir), "--splits", args.splits, "--steps",
                str(args.steps), "--quiet", "--no-reference" if mode == "control" else f"--{mode}", "--json",
                str(work / f"{tag}.json")
            ])
    result = measured(command, args.ranks, env, work / f"{tag}.log")
    result.update(bucket_elements=args.bucket_elements,
                  size=size,
                  mode=mode,
                  zero=args.zero,
                  offload=args.offload,
                  dtype=args.dtype,
                  parameters=parameter_count(*LLAMA[size]),
                  log=str(work / f"{tag}.log"))
    per_step = re.search(r"training: ([0-9.]+) s per step", (work / f"{tag}.log").read_text())
    if mode == "training" and per_step:
        result["step_s"] = float(per_step.group(1))
    if mode != "training" and (work / f"{tag}.json").is_file():
        splits = json.loads((work / f"{tag}.json").read_text())
        result["verdicts"] = {s["name"]: s["verdict"] for s in splits}
        result["update_errors"] = {s["name"]: s["update_errors"] for s in splits}
    return result


def worker(args):
    """Plain training on the check's batches: what a user's script holds in memory for this config."""
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.gafix.gas_check.hf import model_factory, token_batches
    deepspeed.init_distributed()
    rank = int(os.environ.get("RANK", "0"))
    config = json.loads(Path(args.config).read_text())
    config.update(train_micro_batch_size_per_gpu=args.micro, gradient_accumulation_steps=args.gas)
    config.pop("train_batch_size", None)
    torch.manual_seed(1234)
    model = model_factory(args.hf_model)()  # as ds_gas_check builds it
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    per_rank = args.micro * args.gas
    device = get_accelerator().current_device_name()
    start = time.time()
    for batch in token_batches(args.hf_model, args.steps, per_rank * args.ranks):
        for i in range(args.gas):
            lo = rank * per_rank + i * args.micro
            micro = {k: v[lo:lo + args.micro].to(device) for k, v in batch.items()}
            engine.backward(engine(**micro).loss)
            engine.step()
    if rank == 0:
        print(f"training: {(time.time() - start) / args.steps:.2f} s per step", flush=True)
    engine.destroy()
    # Down before exit, as ds_gas_check does: communication threads alive at interpreter teardown abort a rank.
    deepspeed.comm.barrier()
    deepspeed.comm.destroy_process_group()


def control_worker(argv):
    """ds_gas_check with a GAS bug seeded in the engine: the last micro-batch of each accumulated step adds nothing."""
    from deepspeed.gafix.gas_check.cli import main as check
    from deepspeed.runtime.engine import DeepSpeedEngine
    original = DeepSpeedEngine.backward

    def backward(engine, loss, **kwargs):
        dropped = engine.gradient_accumulation_steps() > 1 and engine.is_gradient_accumulation_boundary()
        return original(engine, loss * 0.0 if dropped else loss, **kwargs)

    DeepSpeedEngine.backward = backward
    return check(argv)


def table(path):
    """The markdown table of a results file: each check beside the training run of its size and config."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    key = lambda r: (r["size"], r["zero"], r["offload"], r["dtype"], r.get("bucket_elements"))  # noqa: E731
    training = {key(r): r for r in rows if r["mode"] == "training"}
    lines = [
        *tables.header([
            "model", "config", "mode", "verdicts", "check: peak per rank", "training: peak per rank",
            "check / training", "check - training, per owned parameter", "check's wall time / one training step"
        ])
    ]
    for r in rows:
        base = training.get(key(r))
        if r["mode"] == "training" or base is None:
            continue
        check, train = max(r["rank_peaks_gib"]), max(base["rank_peaks_gib"])
        owned = r["parameters"] / len(r["rank_peaks_gib"])
        step_s = base.get("step_s") or float("nan")
        if r["exit"] in (137, 247, -9):
            verdicts = "killed: out of host memory"
        else:
            verdicts = ", ".join(sorted(set((r.get("verdicts") or {}).values()))) or "exit %d" % r["exit"]
        config = (f"ZeRO-{r['zero']}{' offload' if r['offload'] else ''} {r['dtype']}"
                  f"{', buckets %.0e' % r['bucket_elements'] if r.get('bucket_elements') else ''}")
        lines.append(f"| {r['size']} ({r['parameters'] / 1e6:.0f}M) | {config} | {r['mode']} | {verdicts} | "
                     f"{check:.2f} GiB | {train:.2f} GiB | {check / train:.2f} | "
                     f"{(check - train) * 2**30 / owned:.1f} bytes | {r['wall_s'] / step_s:.0f} |")
    return "\n".join(lines)


def main():
    if sys.argv[1:2] == ["--table"]:
        print(table(sys.argv[2]))
        return 0
    if sys.argv[1:2] == ["--control-worker"]:
        return control_worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="58m", help=f"comma-separated, of {', '.join(LLAMA)}")
    parser.add_argument("--modes",
                        default="reference,no-reference",
                        help="reference, no-reference, control (training always runs)")
    parser.add_argument("--zero", type=int, default=3)
    parser.add_argument("--offload", action="store_true", help="offload_optimizer to the CPU")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--bucket-elements",
                        type=float,
                        help="ZeRO bucket, prefetch, live-parameter and sub-group sizes (default: DeepSpeed's)")
    parser.add_argument("--splits", default="4x1,2x2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", default="gas_check_memory.json", help="results, appended (JSON lines)")
    parser.add_argument("--work", help="directory for configs and logs (default: a temporary one)")
    # worker mode (launched by the parent)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hf-model", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gas", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="gas-check-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    for size in args.sizes.split(","):
        for mode in ["training"] + [m for m in args.modes.split(",") if m]:
            result = run_case(args, size, mode, work)
            print(json.dumps(result), flush=True)
            with open(args.out, "a") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    sys.exit(main())
