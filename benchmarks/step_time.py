#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Training step time, this fork vs pristine upstream, interleaved in one run.

A step is what a user times: GAS micro-batches of forward and backward through ``engine``, then
``engine.step()``, of a GPT-2-shaped causal transformer (pre-LayerNorm blocks, learned positions, tied
embedding) or a Llama-shaped one (RMSNorm, rotary positions, grouped-query attention, SwiGLU). Per config,
the parent starts one worker per side at once (each with its own ``deepspeed`` launcher); each builds the
engine and takes ``--warmup`` steps, then ``--repeat`` rounds alternate the sides (A/B, B/A, ...), each
side timing ``--steps`` steps per round: a round costs its steps, not a launch. The table gives, per
config and side, the median over the rounds of each round's median step time and their spread (min-max),
the ratio fork/pristine (median of the per-round ratios, and their min-max), and the share of the step
spent in the norm and the overflow check on each side (the methods that take them, timed from outside:
upstream's per-group norm and separate overflow check, the fork's single-collective one). With
``--profile``, on a CUDA device, one more step per side under the profiler gives kernel launches and
device-side time per micro-step (benchmarks/device_profile.py).

    python benchmarks/step_time.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
    python benchmarks/step_time.py ... --ranks 1 --model gpt2-125m --configs z2_bf16_gas1 ... --profile  # a GPU

Runs on the CPU accelerator (gloo, one thread per rank) or a GPU, whatever the installs detect.
Not a test: figures go to docs/evidence/performance.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()

from toolkit import options, tables
from toolkit.ports import free_port
from toolkit.sides import pristine_python

# hidden, layers, heads, vocab, context
GPT2 = {
    "gpt2-tiny": (256, 4, 4, 8192, 64),  # 5.3M parameters: what 2 CPU cores train in a benchmark's time
    "gpt2-small": (512, 8, 8, 16384, 256),  # ~34M
    "gpt2-125m": (768, 12, 12, 50257, 1024),
    "gpt2-350m": (1024, 24, 16, 50257, 1024),
}
# hidden, layers, heads, key/value heads, feed-forward, vocab, context
LLAMA = {
    "llama-tiny": (256, 4, 4, 2, 688, 8192, 64),  # 4.5M
    "llama-1b": (2048, 16, 32, 8, 8192, 128256, 1024),  # Llama 3.2 1B's shape, 1.24B
}
MODELS = sorted(GPT2) + sorted(LLAMA)


def config_matrix():
    """name -> (zero stage, offload, dtype, gas)."""
    configs = {}
    for stage in (1, 2, 3):
        for dtype in ("fp32", "bf16"):
            for gas in (1, 8):
                configs[f"z{stage}_{dtype}_gas{gas}"] = (stage, False, dtype, gas)
    for dtype in ("fp32", "bf16"):
        for gas in (1, 8):
            configs[f"z2_offload_{dtype}_gas{gas}"] = (2, True, dtype, gas)
    return configs


CONFIGS = config_matrix()

# Methods that take the grad norm or the overflow check, on either side (upstream's per-group ones
# and the fork's single-collective ones); only those a side has are timed. Nested calls count once.
NORM_METHODS = {
    "deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer":
    ["scaled_global_norm", "_global_norm_and_overflow", "check_overflow", "has_overflow"],
    "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3":
    ["_get_norm_groups", "_global_norm_in_one_collective", "has_overflow", "_overflow_check_and_loss_scale_update"],
    "deepspeed.runtime.bf16_optimizer:BF16_Optimizer": ["get_global_grad_norm", "clip_grad_norm"],
}

# ---------------------------------------------------------------------------------------------- worker


def gpt2_model(hidden, layers, heads, vocab, context):
    import torch

    class Block(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
            self.qkv, self.proj = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
            self.fc, self.out = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, hidden))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT2(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(vocab, hidden), torch.nn.Embedding(context, hidden)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln = torch.nn.LayerNorm(hidden)

        def forward(self, tokens):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            logits = self.ln(x) @ self.wte.weight.t()
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())

    return GPT2()


def llama_model(hidden, layers, heads, kv_heads, ffn, vocab, context):
    import torch
    head = hidden // heads
    inverse = 1.0 / (10000.0**(torch.arange(0, head, 2).float() / head))
    angles = torch.outer(torch.arange(context).float(), inverse)

    class RMSNorm(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            norm = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
            return norm.to(x.dtype) * self.weight

    def rotate(x, cos, sin):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    class Block(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = RMSNorm(), RMSNorm()
            self.q = torch.nn.Linear(hidden, hidden, bias=False)
            self.kv = torch.nn.Linear(hidden, 2 * kv_heads * head, bias=False)
            self.o = torch.nn.Linear(hidden, hidden, bias=False)
            self.gate_up = torch.nn.Linear(hidden, 2 * ffn, bias=False)
            self.down = torch.nn.Linear(ffn, hidden, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.ln1(x)
            q = rotate(self.q(h).view(b, t, heads, head).transpose(1, 2), cos, sin)
            k, v = self.kv(h).view(b, t, 2, kv_heads, head).permute(2, 0, 3, 1, 4)
            k = rotate(k, cos, sin).repeat_interleave(heads // kv_heads, dim=1)
            a = torch.nn.functional.scaled_dot_product_attention(q,
                                                                 k,
                                                                 v.repeat_interleave(heads // kv_heads, dim=1),
                                                                 is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, hidden))
            gate, up = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
            return x + self.down(torch.nn.functional.silu(gate) * up)

    class Llama(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, hidden)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln = RMSNorm()

        def forward(self, tokens):
            t = tokens.shape[1]
            x = self.embed(tokens)
            cos, sin = (f(angles[:t]).to(x.device, x.dtype) for f in (torch.cos, torch.sin))
            for block in self.blocks:
                x = block(x, cos, sin)
            logits = self.ln(x) @ self.embed.weight.t()  # tied, as Llama 3.2 1B's
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())

    return Llama()


def build_model(name):
    return gpt2_model(*GPT2[name]) if name in GPT2 else llama_model(*LLAMA[name])


def vocab_and_context(name):
    shape = GPT2[name] if name in GPT2 else LLAMA[name]
    return shape[-2], shape[-1]


class NormTimer:
    """Wall time spent inside NORM_METHODS (outermost call only), per step."""

    def __init__(self, sync):
        self.sync, self.depth, self.seconds = sync, 0, 0.0
        self._restore = []

    def __enter__(self):
        import importlib
        for target, names in NORM_METHODS.items():
            module_name, class_name = target.split(":")
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            for name in names:
                if name in vars(cls):
                    original = vars(cls)[name]
                    setattr(cls, name, self._timed(original))
                    self._restore.append((cls, name, original))
        return self

    def __exit__(self, *exc):
        for cls, name, original in reversed(self._restore):
            setattr(cls, name, original)

    def _timed(self, original):
        timer = self

        def timed(*args, **kwargs):
            timer.depth += 1
            start = time.perf_counter() if timer.depth == 1 else None
            try:
                return original(*args, **kwargs)
            finally:
                if start is not None:
                    timer.sync()
                    timer.seconds += time.perf_counter() - start
                timer.depth -= 1

        return timed


def engine_config(stage, offload, dtype, gas, micro, optimizer="Adam", lr=1e-4):
    """The benchmarks' engine: ``optimizer`` (torch's, or DeepSpeed's CPU one with offload), clipping 1.0."""
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": optimizer,
            "params": {
                "lr": lr,
                "torch_adam": not offload
            }
        },
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return config


class Channel:
    """Commands from the parent and replies to it, as numbered JSON files in one folder.

    Every rank of a worker reads each command; rank 0 writes the reply. A file appears whole (written aside,
    then renamed), so a reader never sees half of one.
    """

    def __init__(self, folder):
        self.folder = Path(folder)

    def write(self, kind, number, body):
        aside = self.folder / f".{kind}-{number}.tmp"
        aside.write_text(json.dumps(body))
        aside.replace(self.folder / f"{kind}-{number}.json")

    def read(self, kind, number, alive, timeout=None):
        """The body of ``kind``-``number``, waiting for it while ``alive()``; None once not alive or timed out."""
        path = self.folder / f"{kind}-{number}.json"
        deadline = None if timeout is None else time.monotonic() + timeout
        while not path.exists():
            if not alive() or (deadline is not None and time.monotonic() > deadline):
                return None
            time.sleep(0.01)
        return json.loads(path.read_text())


class Trainer:
    """One config's engine on one side: built once, then timed round by round."""

    def __init__(self, name, args, accelerator):
        import torch
        import deepspeed
        stage, offload, dtype, gas = CONFIGS[name]
        self.sync, device = accelerator.synchronize, accelerator.current_device_name()
        torch.manual_seed(0)
        with torch.device(device):  # a 1B model initialised on the host would take longer than its steps
            model = build_model(args.model)
        self.parameters = sum(p.numel() for p in model.parameters())
        self.engine, *_ = deepspeed.initialize(model=model,
                                               model_parameters=model.parameters(),
                                               config=engine_config(stage, offload, dtype, gas, args.micro_batch))
        vocab, context = vocab_and_context(args.model)
        gen = torch.Generator().manual_seed(1 + deepspeed.comm.get_rank())
        self.batches = [
            torch.randint(0, vocab, (args.micro_batch, context), generator=gen).to(device) for _ in range(gas)
        ]
        self.time(args.warmup)

    def micro_step(self, tokens):
        self.engine.backward(self.engine(tokens))
        self.engine.step()

    def time(self, steps):
        times, norm_times = [], []
        with NormTimer(self.sync) as timer:
            for _ in range(steps):
                self.sync()
                timer.seconds = 0.0
                start = time.perf_counter()
                for tokens in self.batches:
                    self.micro_step(tokens)
                self.sync()
                times.append(time.perf_counter() - start)
                norm_times.append(timer.seconds)
        if not times:
            return {}
        return {"step_s": statistics.median(times), "norm_s": statistics.median(norm_times), "steps_s": times}

    def profile(self):
        from device_profile import per_micro_step, summary
        return summary(per_micro_step([lambda t=t: self.micro_step(t) for t in self.batches], self.sync))


def serve(args):
    """A worker: runs the parent's commands until told to exit (or the parent is gone)."""
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    deepspeed.init_distributed()
    accelerator = get_accelerator()
    channel, rank0 = Channel(args.serve), deepspeed.comm.get_rank() == 0

    def parent_alive():
        try:
            os.kill(args.parent_pid, 0)
            return True
        except OSError:
            return False

    def reply(number, body):
        if rank0:
            channel.write("reply", number, body)

    reply(0, {"version": deepspeed.__version__, "torch": torch.__version__, "device": accelerator.device_name()})
    trainer, number = None, 0
    while True:
        number += 1
        command = channel.read("command", number, parent_alive)
        if command is None or command["op"] == "exit":
            reply(number, {})
            return
        try:
            if command["op"] == "build":
                trainer = Trainer(command["config"], args, accelerator)
                body = {"parameters": trainer.parameters}
            elif command["op"] == "time":
                body = trainer.time(command["steps"])
            elif command["op"] == "profile":
                body = {"profile": trainer.profile()}
        except Exception as err:  # a config one side cannot run is reported, not fatal to the others
            body = {"error": f"{type(err).__name__}: {err}"}
        reply(number, body)


# ---------------------------------------------------------------------------------------------- parent


class SideFailed(RuntimeError):
    pass


class Side:
    """One side's worker, started with that side's ``deepspeed`` launcher and kept for the whole run."""

    def __init__(self, name, python, args, folder, extensions_dir):
        launcher = Path(python).with_name("deepspeed")
        if not launcher.exists():
            sys.exit(f"no deepspeed launcher beside {python}")
        self.name, self.timeout, self.number = name, args.timeout, 0
        folder.mkdir(parents=True, exist_ok=True)
        self.channel, self.log_path = Channel(folder), folder / "worker.log"
        cmd = [
            str(launcher), "--num_gpus",
            str(args.ranks), "--no_local_rank", "--master_port",
            str(free_port()),
            str(HERE), "--serve",
            str(folder), "--parent-pid",
            str(os.getpid()), "--model", args.model, "--micro-batch",
            str(args.micro_batch), "--warmup",
            str(args.warmup)
        ]
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir))
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def send(self, op, **body):
        self.number += 1
        self.channel.write("command", self.number, {"op": op, **body})

    def wait(self):
        body = self.channel.read("reply", self.number, lambda: self.proc.poll() is None, self.timeout)
        if body is None:
            self.proc.kill()
            raise SideFailed(f"{self.name}'s worker gave no reply to command {self.number} (exit "
                             f"{self.proc.poll()}):\n{self.log_path.read_text()[-3000:]}")
        return body

    def ask(self, op, **body):
        self.send(op, **body)
        return self.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.ask("exit")
                self.proc.wait(timeout=60)
            except (SideFailed, subprocess.TimeoutExpired):
                self.proc.kill()


def both(sides, op, **body):
    """``op`` on every side at once (building engines is not timed); their replies by side."""
    for side in sides.values():
        side.send(op, **body)
    return {name: side.wait() for name, side in sides.items()}


def summarise(rounds):
    """Per config: each side's median step time and spread, the ratio and its spread, the norm share."""
    rows = []
    for name in rounds[0]["fork"]["configs"]:
        per_side = {side: [r[side]["configs"][name] for r in rounds] for side in ("fork", "pristine")}
        errors = {side: x["error"] for side, values in per_side.items() for x in values if "error" in x}
        if errors:
            rows.append({"config": name, "errors": errors})
            continue
        row = {"config": name, "parameters": per_side["fork"][0]["parameters"]}
        for side, values in per_side.items():
            steps = [v["step_s"] for v in values]
            row[side] = {
                "step_ms": statistics.median(steps) * 1e3,
                "spread_ms": [min(steps) * 1e3, max(steps) * 1e3],
                "norm_share": statistics.median(v["norm_s"] / v["step_s"] for v in values),
            }
        ratios = [f["step_s"] / p["step_s"] for f, p in zip(per_side["fork"], per_side["pristine"])]
        row["ratio"], row["ratio_spread"] = statistics.median(ratios), [min(ratios), max(ratios)]
        rows.append(row)
    return rows


def markdown(rows, header):
    lines = [
        header, "", *tables.header(
            [
                "config", "pristine ms (spread)", "fork ms (spread)", "fork/pristine (spread)",
                "norm share pristine / fork"
            ],
            right={"pristine ms (spread)", "fork ms (spread)", "fork/pristine (spread)", "norm share pristine / fork"})
    ]
    for row in rows:
        if "errors" in row:
            lines.append(f"| {row['config']} | {row['errors']} | | | |")
            continue
        cell = lambda s: f"{s['step_ms']:.1f} ({s['spread_ms'][0]:.1f}-{s['spread_ms'][1]:.1f})"
        lines.append(f"| {row['config']} | {cell(row['pristine'])} | {cell(row['fork'])} | {row['ratio']:.3f} "
                     f"({row['ratio_spread'][0]:.3f}-{row['ratio_spread'][1]:.3f}) | "
                     f"{row['pristine']['norm_share']:.1%} / {row['fork']['norm_share']:.1%} |")
    return "\n".join(lines)


def profile_markdown(profiles):
    lines = [
        "Per micro-step, from the profiler (one step): kernel launches and device-side ms, fork / pristine", "",
        *tables.header(
            [
                "config", "launches, non-boundary", "launches, boundary", "device ms, non-boundary",
                "device ms, boundary"
            ],
            right={"launches, non-boundary", "launches, boundary", "device ms, non-boundary", "device ms, boundary"})
    ]
    for name, sides in profiles.items():
        fork, pristine = sides["fork"].get("profile"), sides["pristine"].get("profile")
        if not fork or not pristine:
            lines.append(f"| {name} | {sides['fork'].get('error', '')} {sides['pristine'].get('error', '')} | | | |")
            continue

        def cell(part, key, form):
            if fork[part] is None:
                return ""
            return f"{fork[part][key]:{form}} / {pristine[part][key]:{form}}"

        lines.append(f"| {name} | {cell('non_boundary', 'launches', 'g')} | {cell('boundary', 'launches', 'g')} | "
                     f"{cell('non_boundary', 'device_ms', '.2f')} | {cell('boundary', 'device_ms', '.2f')} |")
    return "\n".join(lines)


def report(args, hello, rounds, profiles, done):
    """The table so far (``done`` configs of ``args.configs``), printed at the end and written after every config."""
    kept = [{side: {"configs": {n: r[side]["configs"][n] for n in done}} for side in r} for r in rounds]
    rows = summarise(kept) if done else []
    header = (f"{args.model}, {args.ranks} rank(s) on {hello['fork']['device']}, micro-batch {args.micro_batch}, "
              f"Adam, clipping 1.0; {args.repeat} alternating rounds x {args.steps} steps after {args.warmup} "
              f"warm-up steps; fork {hello['fork']['version']}, pristine {hello['pristine']['version']}, "
              f"torch {hello['fork']['torch']}")
    table = markdown(rows, header)
    if profiles:
        table += "\n\n" + profile_markdown(profiles)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "header": header,
                    "rows": rows,
                    "rounds": kept,
                    "profiles": profiles,
                    "configs_left": [n for n in args.configs if n not in done]
                },
                indent=1) + "\n")
    return table


def start_sides(args, folder):
    """Both sides' workers for one config, started at once; each side's first reply says what it runs."""
    pythons = {"fork": args.fork_python, "pristine": args.pristine_python}
    sides = {
        name: Side(name, python, args, folder / name,
                   Path(args.extensions_dir).resolve() / name)
        for name, python in pythons.items()
    }
    return sides, {name: side.wait() for name, side in sides.items()}


def parent(args):
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ds-step-time-"))
    rounds = [{side: {"configs": {}} for side in ("fork", "pristine")} for _ in range(args.repeat)]
    profiles, done, hello = {}, [], None
    for name in args.configs:
        started = time.time()
        # Fresh workers per config: an engine leaves memory and state behind in its process after destroy() (a 1B
        # model's next engine ran out of memory; an engine built after a ZeRO-3 one runs other host code), and a
        # launch costs no timed step.
        sides, hello = start_sides(args, work / name)
        try:
            built = both(sides, "build", config=name)
            for index, results in enumerate(rounds):
                order = ["fork", "pristine"] if index % 2 == 0 else ["pristine", "fork"]
                for side in order:
                    result = built[side] if "error" in built[side] else sides[side].ask("time", steps=args.steps)
                    results[side]["configs"][name] = dict(result, parameters=built[side].get("parameters"))
            if args.profile and hello["fork"]["device"] == "cuda" and not any("error" in b for b in built.values()):
                profiles[name] = {side: sides[side].ask("profile") for side in sides}
        finally:
            for side in sides.values():
                side.close()
        done.append(name)
        report(args, hello, rounds, profiles, done)
        print(f"{name}: {args.repeat} rounds in {time.time() - started:.0f} s", file=sys.stderr)
    if args.profile and hello["fork"]["device"] != "cuda":
        print(f"--profile: the profiler reads CUDA devices only, not {hello['fork']['device']}", file=sys.stderr)
    print(report(args, hello, rounds, profiles, done))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    options.add_sides(parser)
    parser.add_argument("--model", default="gpt2-tiny", choices=MODELS)
    parser.add_argument("--configs", nargs="+", default=sorted(CONFIGS), choices=sorted(CONFIGS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and round")
    parser.add_argument("--warmup", type=int, default=1, help="steps after building an engine, not timed")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds per config")
    parser.add_argument("--profile", action="store_true", help="kernel launches and device time (CUDA only)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a worker may take for one command")
    options.add_extensions_dir(parser, default="build/bench-extensions", per_side=True)
    parser.add_argument("--work-dir", help="the workers' command folders and logs (default: a temporary directory)")
    parser.add_argument("--json", help="also write the table's rows and every round's results here, after each config")
    args = parser.parse_args()
    if args.serve:
        return serve(args)
    # Only the parent needs pristine: a worker resolving it would build a venv on every launch.
    args.pristine_python = pristine_python(args.pristine_python, args.fork_python)
    parent(args)


if __name__ == "__main__":
    main()
