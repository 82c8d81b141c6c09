# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a micro-step costs the device, from the profiler: kernel launches and device-side time.

Host time on a shared GPU is noisy and a host count (benchmarks/step_counts.py) cannot see the device; the
profiler's trace can. Used by the step-time and step-count benchmarks on a CUDA device; on any other
accelerator there is nothing to read and ``per_micro_step`` returns None.
"""

# The runtime and driver calls that launch a kernel (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel...).
LAUNCH = "LaunchKernel"


def profiles_device():
    from deepspeed.accelerator import get_accelerator
    return get_accelerator().device_name() == "cuda"


def per_micro_step(micro_steps, sync):
    """Each of ``micro_steps`` (callables) run once under the profiler: {"launches", "device_ms"} for each.

    ``launches`` counts the kernel launches the host issued; ``device_ms`` is the sum of the device-side
    durations of the kernels, copies and fills it ran (time the device was busy, overlap counted twice).
    """
    if not profiles_device():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    counted = []
    for micro_step in micro_steps:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            micro_step()
            sync()
        events = prof.events()
        on_device = [e for e in events if e.device_type == DeviceType.CUDA]
        counted.append({
            "launches": sum(LAUNCH in e.name for e in events if e.device_type == DeviceType.CPU),
            "device_ms": sum(e.time_range.elapsed_us() for e in on_device) / 1e3,
        })
    return counted


def summary(counted):
    """Per-micro-step counts of one step as the benchmarks report them: the median of the non-boundary micro-steps
    (None for a step counted whole) and the boundary (last) one."""
    import statistics
    if counted is None:
        return None
    return {
        "non_boundary": {
            key: statistics.median(c[key] for c in counted[:-1])
            for key in counted[0]
        } if len(counted) > 1 else None,
        "boundary": counted[-1],
    }
