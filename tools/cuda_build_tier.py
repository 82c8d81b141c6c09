# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The CUDA build of the fused_norm op on a machine without a GPU, for CUDA 12 and CUDA 13 torch builds.

Per torch build: a venv with that torch and the registry's nvcc of its CUDA release, a CUDA_HOME laid out
from those packages, then

- prebuild: ``DS_ACCELERATOR=cuda DS_SKIP_CUDA_CHECK=1 DS_BUILD_FUSED_NORM=1 pip install --no-build-isolation``
  of this repository for ``--arch-list``; the -gencode targets nvcc compiled are read from the build log;
- load: the compiled op imports (its CUDA libraries resolve without a GPU);
- jit: DeepSpeed's JIT build of the same op (``FusedNormBuilder().jit_load()``) in an empty extensions dir;
- cpu path: the CUDA-enabled binary's CPU kernel against a CPU-only build of the op (the CPU accelerator's
  JIT build, same torch, same sources) on the same tensors: every result bit for bit.

    tools/cuda-build-tier [--torch 2.15.0:13.2 --torch 2.10.0:12.8] [--json results.json]

Venvs are kept in --work-dir (build/cuda-build-tier) and reused; torch's CUDA wheels are several GB.
Writes a Markdown table (and --json). Exit 0 when every cell built, loaded and matched.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from toolkit import REPO, tables, venvs
from toolkit.logs import run_logged

# The newest torch build of each CUDA major the registry serves, with its CUDA release (major.minor).
DEFAULT_CELLS = ["2.15.0:13.2", "2.10.0:12.8"]
ARCH_LIST = "8.0;9.0;9.0a;10.0a;12.0+PTX"
# requirements/requirements.txt of the pinned upstream sdist (torch aside).
UPSTREAM_REQUIREMENTS = [
    "einops", "hjson", "msgpack", "ninja", "numpy", "packaging>=20.0", "psutil", "py-cpuinfo", "pydantic>=2.0.0",
    "tqdm"
]


def nvcc_packages(cuda):
    """The registry's packages that make an nvcc of CUDA ``cuda`` (major.minor) and the headers it needs."""
    major, minor = cuda.split(".")
    spec = f"=={major}.{minor}.*"
    if major == "12":
        names = ["nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12"]
    else:
        names = ["nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl"]
    return [name + spec for name in names]


def python_output(python, code, env, log):
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    with open(log, "a") as out:
        out.write(f"$ python -c {code!r}\n{proc.stdout}{proc.stderr}\n")
    return proc


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def lay_out_cuda_home(site_packages, home):
    """CUDA_HOME as torch's cpp_extension and DeepSpeed expect it (bin/nvcc, include, lib64), of symlinks into
    the nvidia packages: nvidia/cu13/ for CUDA 13, nvidia/cuda_nvcc, cuda_runtime, cuda_cccl/ for CUDA 12."""
    nvidia = Path(site_packages) / "nvidia"
    roots = sorted(nvidia.glob("cu1[3-9]")) + [nvidia / name for name in ("cuda_nvcc", "cuda_runtime", "cuda_cccl")]
    roots = [root for root in roots if root.is_dir()]
    home.mkdir(parents=True, exist_ok=True)
    for sub in ("bin", "nvvm"):
        for root in roots:
            if (root / sub).is_dir() and not (home / sub).exists():
                (home / sub).symlink_to(root / sub)
    for sub, target in (("include", "include"), ("lib", "lib64")):
        (home / target).mkdir(exist_ok=True)
        for root in roots:
            for entry in sorted((root / sub).glob("*")) if (root / sub).is_dir() else []:
                link = home / target / entry.name
                if not link.exists():
                    link.symlink_to(entry)
    # Linking takes -lcudart: the packages ship libcudart.so.<major> only.
    lib64 = home / "lib64"
    versioned = sorted(lib64.glob("libcudart.so.*"))
    if versioned and not (lib64 / "libcudart.so").exists():
        (lib64 / "libcudart.so").symlink_to(versioned[0])
    if not (home / "bin" / "nvcc").exists():
        return None  # CUDA 12's nvidia-cuda-nvcc-cu12 (12.8, 12.9) ships ptxas, not nvcc
    return home


SUMSQ = """
import importlib, json, sys, torch
tensors = torch.load(sys.argv[1], weights_only=True)
op = importlib.import_module(sys.argv[2]) if sys.argv[2] != 'cpu-jit' else None
if op is None:
    from deepspeed.ops.fused_norm import load_op
    op = load_op()
total, nonfinite, per = op.multi_tensor_sumsq(tensors, True)
print(json.dumps({'total': total.double().numpy().tobytes().hex(), 'nonfinite': bool(nonfinite),
                  'per': per.double().numpy().tobytes().hex(), 'value': float(total)}))
"""

TENSORS = """
import sys, torch
gen = torch.Generator().manual_seed(7)
sizes = [0, 1, 7, 65535, 65536, 65537, 2**20 + 3] + [int(n) for n in torch.randint(1, 300, (200, ), generator=gen)]
dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
tensors = [(torch.randn(n, generator=gen) * 3).to(dtypes[i % 4]) for i, n in enumerate(sizes)]
torch.save(tensors, sys.argv[1])
"""


def cell(torch_version, cuda, args, work):
    name = f"torch{torch_version}-cu{cuda.replace('.', '')}"
    log = work / f"{name}.log"
    log.write_text("")
    row = {"torch": torch_version, "cuda": cuda, "arch_list": args.arch_list, "log": str(log)}
    venv = work / f"venv-{name}"
    python = str(venvs.python_of(venv))
    home, failure = toolchain(venv, torch_version, cuda, args, work / f"cuda-home-{name}", log)
    if failure:
        return dict(row, built=False, detail=failure)
    version = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    row["nvcc"] = re.search(r"release ([\d.]+)", version).group(1) if "release" in version else "?"
    env = dict(os.environ,
               CUDA_HOME=str(home),
               DS_ACCELERATOR="cuda",
               DS_SKIP_CUDA_CHECK="1",
               DS_BUILD_FUSED_NORM="1",
               TORCH_CUDA_ARCH_LIST=args.arch_list,
               MAX_JOBS=str(os.cpu_count() or 2))
    if args.sdist:
        env["DS_GAFIX_UPSTREAM_SDIST"] = args.sdist
    code, seconds, build_log = prebuild(venv, python, env, log)
    row["prebuild_s"] = round(seconds)
    row["gencode"] = sorted(set(re.findall(r"-gencode=arch=compute_\w+,code=(\w+)", build_log)))
    if code != 0:
        return dict(row, built=False, detail=last_line(build_log))
    row["built"] = True

    load_env = dict(env, TORCH_EXTENSIONS_DIR=str(work / f"ext-jit-{name}"))
    load_env.pop("DS_BUILD_FUSED_NORM")
    proc = python_output(python, f"import importlib; importlib.import_module({FUSED_NORM_OP!r}); print('loaded')",
                         load_env, log)
    row["loaded"] = proc.returncode == 0 and "loaded" in proc.stdout
    if not row["loaded"]:
        row["detail"] = last_line(proc.stderr)
    row.update(cpu_path_comparison(python, work, name, load_env, log))
    jit_code = (
        "from deepspeed.ops.op_builder.fused_norm import FusedNormBuilder as B; "
        "import time; t = time.time(); B().jit_load(verbose=False); print('jit built', round(time.time() - t))")
    proc = python_output(python, jit_code, load_env, log)
    row["jit"] = "built" if proc.returncode == 0 and "jit built" in proc.stdout else last_line(proc.stderr)[:160]
    return row


FUSED_NORM_OP = "deepspeed.ops.fused_norm.fused_norm_op"


def toolchain(venv, torch_version, cuda, args, cuda_home, log):
    """``venv`` with that torch and CUDA's nvcc (the registry's packages laid out as ``cuda_home``, or
    ``--cuda-home``): ``(the CUDA home, None)``, or ``(None, why not)``."""
    venvs.create(venv, sys.executable, log)
    code, _ = venvs.pip_install(venv, [f"torch=={torch_version}", "setuptools>=64", "wheel", *nvcc_packages(cuda)],
                                log,
                                timeout=3600)
    if code != 0:
        return None, f"installing torch/nvcc failed (exit {code})"
    if cuda in args.cuda_home:
        return Path(args.cuda_home[cuda]), None
    site = python_output(str(venvs.python_of(venv)), "import sysconfig; print(sysconfig.get_paths()['purelib'])", None,
                         log).stdout
    home = lay_out_cuda_home(site.strip(), cuda_home)
    if home is None:
        return None, (f"no nvcc: the registry's packages {', '.join(nvcc_packages(cuda))} hold "
                      f"no nvcc driver; pass --cuda-home {cuda}=DIR for a CUDA {cuda} toolkit")
    return home, None


def prebuild(venv, python, env, log):
    """The fork from this repository with the fused norm prebuilt (``DS_BUILD_FUSED_NORM=1``) into ``venv``:
    ``(exit status, seconds, the build's part of the log)``."""
    # deepspeed's own requirements first: a later plain install of the repository would replace the CUDA build.
    venvs.pip_install(venv, UPSTREAM_REQUIREMENTS, log, timeout=3600)
    before = log.stat().st_size
    code, seconds = run_logged(
        [python, "-m", "pip", "install", "-v", "--no-build-isolation", "--force-reinstall", "--no-deps",
         str(REPO)],
        log,
        env=env,
        timeout=3600)
    with open(log) as f:
        f.seek(before)
        return code, seconds, f.read()


def cpu_path_comparison(python, work, name, load_env, log):
    """The prebuilt CUDA binary's CPU path against a CPU-only JIT build, on the same tensors, bit for bit."""
    tensors = work / "tensors.pt"
    subprocess.run([python, "-c", TENSORS, str(tensors)], check=True, cwd="/")
    cuda_binary = subprocess.run([python, "-c", SUMSQ, str(tensors), FUSED_NORM_OP],
                                 capture_output=True,
                                 text=True,
                                 env=load_env,
                                 cwd="/")
    cpu_env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(work / f"ext-cpu-{name}"))
    cpu_only = subprocess.run([python, "-c", SUMSQ, str(tensors), "cpu-jit"],
                              capture_output=True,
                              text=True,
                              env=cpu_env,
                              cwd="/")
    with open(log, "a") as out:
        out.write(f"cuda binary: {cuda_binary.stdout}{cuda_binary.stderr[-2000:]}\n"
                  f"cpu-only build: {cpu_only.stdout}{cpu_only.stderr[-2000:]}\n")
    if cuda_binary.returncode == 0 and cpu_only.returncode == 0:
        a, b = json.loads(last_line(cuda_binary.stdout)), json.loads(last_line(cpu_only.stdout))
        return {
            "cpu_path_equal": all(a[key] == b[key] for key in ("total", "nonfinite", "per")),
            "sum_of_squares": a["value"]
        }
    return {
        "cpu_path_equal": False,
        "detail": last_line(cuda_binary.stderr if cuda_binary.returncode else cpu_only.stderr)
    }


def markdown(rows):
    lines = [
        *tables.header([
            "torch", "CUDA", "nvcc", "archs (-gencode code=)", "prebuild", "loads", "JIT build",
            "CPU path = CPU-only build"
        ])
    ]
    for r in rows:
        built = f"built, {r['prebuild_s']} s" if r.get("built") else f"not built: {r.get('detail', '')}"
        lines.append(f"| {r['torch']} | {r['cuda']} | {r.get('nvcc', '?')} | {', '.join(r.get('gencode', []))} | "
                     f"{built} | {'yes' if r.get('loaded') else 'no'} | {r.get('jit', '-')} | "
                     f"{'bit for bit' if r.get('cpu_path_equal') else 'NO'} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch",
                        action="append",
                        help="TORCH_VERSION:CUDA (repeatable; default: "
                        f"{' '.join(DEFAULT_CELLS)})")
    parser.add_argument("--arch-list", default=ARCH_LIST, help="TORCH_CUDA_ARCH_LIST for the builds")
    parser.add_argument("--work-dir", default=str(REPO / "build" / "cuda-build-tier"))
    parser.add_argument("--sdist", help="a local upstream sdist (DS_GAFIX_UPSTREAM_SDIST) instead of pip download")
    parser.add_argument("--cuda-home",
                        action="append",
                        default=[],
                        metavar="CUDA=DIR",
                        help="a CUDA toolkit for that release instead of the registry's packages (repeatable)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    args.cuda_home = dict(spec.split("=", 1) for spec in args.cuda_home)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.torch or DEFAULT_CELLS:
        torch_version, _, cuda = spec.partition(":")
        if not re.fullmatch(r"\d+\.\d+", cuda):
            parser.error(f"--torch {spec}: write TORCH_VERSION:CUDA, e.g. 2.15.0:13.2")
        started = time.time()
        row = cell(torch_version, cuda, args, work)
        row["seconds"] = round(time.time() - started)
        rows.append(row)
        print(f"cuda-build-tier: torch {torch_version} (CUDA {cuda}): {row}", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"arch_list": args.arch_list, "rows": rows}, indent=1) + "\n")
    ok = all(r.get("built") and r.get("loaded") and r.get("cpu_path_equal") for r in rows)
    return 0 if ok else 1
