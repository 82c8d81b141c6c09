# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""DeepCompile's native op (``csrc/compile``: CUDA streams and NCCL) for its ZeRO-1, ZeRO-2 and ZeRO-3 passes, in torch
on any device, so that DeepCompile's own Python (the engine's hooks, the backend, the graph passes that insert
``torch.ops.dc.reduce_grad``, ``end_backward`` and ZeRO-3's ``allgather_param`` / ``release_param``, the profiler) runs
on a CPU with gloo.

It keeps the C++ runtime's state and order of operations, line for line where they decide a number: the parameter
registry and its gradient targets, the reduce buckets shared by every graph (created per dtype on first use,
cleared by the last backward graph), each graph's executor with its pending reduce tasks per dtype, the ZeRO-1
executor's local accumulation until the step's last backward, the pre-division by the world size before a summing
all-reduce (ZeRO-3: a reduce-scatter into each rank's partition, added to it after the step's first backward), the
copy of each parameter's slice into its target at its offset, ZeRO-3's gather of a parameter's partitions (its first
numel elements, in the dtype the graph asks for), and the C++ ``assert`` that a
swapped bucket exists (raised here as ``NativeAssertion``, where the native build aborts the process). Streams,
events and the bucket memory itself are left out: on one stream they order nothing. Off CUDA, DeepCompile's memory
profiler is left out too (it only records, for ZeRO-3's scheduling), and so is ZeRO-3's operator profiler, which
needs the device's timing events: without them it fails at its first timed node and the pass takes default metadata,
as it does here. ``tools/gpu-check`` runs the real op."""

import torch

import deepspeed.comm as dist


class NativeAssertion(AssertionError):
    """A C++ ``assert`` of the native runtime failing (the native build aborts the process there)."""


def _check(condition, what):
    if not condition:
        raise NativeAssertion(what)


class _Param:

    def __init__(self, ds_tensor, grad_buffer, offset, shape=None, grad_dtype=None):
        self.ds_tensor = ds_tensor
        self.grad_buffer = grad_buffer
        self.offset = offset
        self.shape = shape  # ZeRO-3: the whole parameter's shape
        self.grad_dtype = grad_dtype  # ZeRO-3: the dtype a gradient is cast to before its bucket


class _Buckets:
    """DoubleBufferedReduceBucket: one bucket per dtype, made on first use; swap asserts it exists."""

    def __init__(self, size):
        self.size = size
        self.current = {}

    def get(self, dtype):
        if dtype not in self.current:
            self.current[dtype] = {"offset": 0, "size": self.size}
        return self.current[dtype]

    def swap(self, dtype):
        _check(dtype in self.current, "DoubleBufferedReduceBucket::swap: hasKey(current_buffer_, scalar_type)")
        self.current[dtype]["offset"] = 0

    def clear(self):
        self.current.clear()


class _Executor:
    """CustomOpExecutor with the ZeRO-1 (``z1``), ZeRO-2 (``z2``) or ZeRO-3 (``z3``) executor's overrides."""

    def __init__(self, runtime, kind, ds_ids):
        self.runtime = runtime
        self.kind = kind
        self.param_updated = False
        self.reduce_tasks = {}  # dtype -> [(ds_id, send buffer)]
        self.grad_tensors = {}  # z1: gradients accumulated locally until the step's last backward
        self.has_acc_grad = {ds_id: False for ds_id in ds_ids}  # z2, z3

    def start_backward(self, update):
        self.param_updated = update

    def end_backward(self):
        for dtype in list(self.reduce_tasks):
            if self.reduce_tasks[dtype] or not self.runtime.flush_empty_skipped:
                self.flush(dtype)
        if self.kind in ("z2", "z3") and self.param_updated:
            for ds_id in self.has_acc_grad:
                self.has_acc_grad[ds_id] = False

    def reduce_grad(self, grad, ds_id):
        grad_dtype = self.runtime.params[ds_id].grad_dtype
        if grad_dtype is not None and grad.dtype != grad_dtype:
            grad = grad.to(grad_dtype)
        if self.kind == "z1":
            if ds_id not in self.grad_tensors:
                self.grad_tensors[ds_id] = grad
            else:
                self.grad_tensors[ds_id].add_(grad)
            if self.param_updated:
                self._reduce(self.grad_tensors.pop(ds_id), ds_id)
            return
        self._reduce(grad, ds_id)

    def _reduce(self, grad, ds_id):
        dtype = grad.dtype
        bucket = self.runtime.buckets.get(dtype)
        if bucket["offset"] > 0 and bucket["offset"] + grad.numel() > bucket["size"]:
            self.flush(dtype)
            bucket = self.runtime.buckets.get(dtype)
        if grad.numel() > bucket["size"]:
            bucket["size"] = grad.numel()
        bucket["offset"] += grad.numel()
        self.reduce_tasks.setdefault(dtype, []).append((ds_id, grad.contiguous().view(-1).detach().clone()))

    def flush(self, dtype):
        if dtype not in self.reduce_tasks:
            return
        runtime = self.runtime
        world_size = dist.get_world_size(group=runtime.process_group)
        if self.kind == "z3":
            self._reduce_scatter(dtype, world_size)
            return
        for _, send in self.reduce_tasks[dtype]:
            if runtime.pre_div_reduce:
                send.div_(world_size)
            dist.all_reduce(send, group=runtime.process_group)  # ncclSum after the pre-division
        for ds_id, send in self.reduce_tasks[dtype]:
            param = runtime.params[ds_id]
            target = param.grad_buffer.view(-1)
            if target.numel() == 0:
                continue
            received = send[param.offset:param.offset + target.numel()]
            if self.kind == "z2" and self.has_acc_grad[ds_id]:
                target.add_(received)
            else:
                target.copy_(received)
            if self.kind == "z2":
                self.has_acc_grad[ds_id] = True
        runtime.buckets.swap(dtype)
        self.reduce_tasks[dtype].clear()

    def _reduce_scatter(self, dtype, world_size):
        """ZeRO-3: each gradient reduce-scattered into this rank's partition of it, which is the parameter's grad
        buffer: copied there by the step's first backward, added by the others (``accumulate=False``, a control:
        copied every time, so only the last micro-batch counts)."""
        runtime = self.runtime
        for ds_id, send in self.reduce_tasks[dtype]:
            param = runtime.params[ds_id]
            partition = param.ds_tensor.numel()
            padded = send.new_zeros(partition * world_size)
            padded[:send.numel()] = send
            if runtime.pre_div_reduce:
                padded.div_(world_size)
            received = send.new_empty(partition)
            dist.reduce_scatter_tensor(received, padded, group=runtime.process_group)
            target = param.grad_buffer.view(-1)
            if target.numel() == 0:
                continue
            received = received[:target.numel()].to(target.dtype)
            if self.has_acc_grad[ds_id] and runtime.accumulate:
                target.add_(received)
            else:
                target.copy_(received)
            self.has_acc_grad[ds_id] = True
        runtime.buckets.swap(dtype)
        self.reduce_tasks[dtype].clear()


class DeepCompileStandIn:
    """The handle ``get_deepcompile_handle()`` returns, for the ZeRO-1/2/3 passes."""

    def __init__(self):
        self.profile = False
        self.executors = {}
        self.params = {}
        self.buckets = None
        self.process_group = None
        self.pre_div_reduce = True
        # The native op's fix (patch Flush-only-the-DeepCompile-reduce-buckets-that-hold-): a dtype with no pending
        # task is not flushed at the end of a backward.
        self.flush_empty_skipped = True
        self.accumulate = True  # False: a control whose ZeRO-3 gradients overwrite the step's earlier ones

    def init(self, process_group, config, reduce_bucket_size):
        self.process_group = process_group
        self.params = {}
        self.buckets = _Buckets(int(reduce_bucket_size))

    def cleanup(self):
        self.reset()
        self.buckets = None
        self.params = {}
        self.process_group = None
        self.profile = False

    def reset(self):
        self.executors.clear()

    def enable_profiling(self, enable):
        self.profile = enable

    def is_profiling(self):
        return self.profile

    def register_param(self, ds_id, shape, ds_tensor, grad_buffer, offset):
        grad_buffer.zero_()
        self.params[ds_id] = _Param(ds_tensor, grad_buffer, int(offset))

    def update_param_grad_buffer(self, ds_id, grad_buffer, offset):
        if grad_buffer.numel() > 0:
            grad_buffer.zero_()
        self.params[ds_id].grad_buffer = grad_buffer
        self.params[ds_id].offset = int(offset)

    def register_graph_z1(self, graph_id, ds_ids):
        self.executors[graph_id] = _Executor(self, "z1", ds_ids)

    def register_graph_z2(self, graph_id, ds_ids):
        self.executors[graph_id] = _Executor(self, "z2", ds_ids)

    def register_z3_param(self, ds_id, shape, ds_tensor, grad_buffer, persistent, expected_grad_dtype):
        self.params[ds_id] = _Param(ds_tensor, grad_buffer, 0, tuple(shape), expected_grad_dtype)

    def register_graph_z3(self, graph_id, ds_ids):
        self.executors[graph_id] = _Executor(self, "z3", ds_ids)

    def set_persistent(self, ds_id):
        pass  # the native op allocates the gathered buffer here; this stand-in gathers at every use

    def allgather_param(self, ds_id, dtype):
        """The whole parameter from every rank's partition, in ``dtype`` (default: the partition's)."""
        param = self.params[ds_id]
        world_size = dist.get_world_size(group=self.process_group)
        gathered = param.ds_tensor.new_empty(param.ds_tensor.numel() * world_size)
        dist.all_gather_into_tensor(gathered, param.ds_tensor.reshape(-1), group=self.process_group)
        numel = 1
        for size in param.shape:
            numel *= size
        whole = gathered[:numel].view(param.shape)
        return whole if dtype is None else whole.to(dtype)

    def start_forward(self):
        pass

    def end_forward(self):
        pass

    def start_backward(self, update):
        for executor in self.executors.values():
            executor.start_backward(update)

    def clear_all_gathered_params(self):
        pass

    def invalidate_gathered_param(self, ds_id):
        pass

    # the ops behind torch.ops.dc

    def reduce_grad(self, grad, graph_id, ds_id):
        _check(graph_id in self.executors, "hasKey(executors, graph_id)")
        if not self.profile:
            self.executors[graph_id].reduce_grad(grad, ds_id)
        return grad.new_empty(0)

    def end_backward(self, graph_id, release_reduce_buckets):
        self.executors[graph_id].end_backward()
        if release_reduce_buckets:
            self.buckets.clear()


def _is_fake(value):
    from torch._subclasses.fake_tensor import FakeTensor
    if isinstance(value, (list, tuple)):
        return any(_is_fake(v) for v in value)
    return isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.is_meta)


_LIBRARY = None


def _run_on_this_device():
    """What DeepCompile's Python assumes of a CUDA device, on another one (the CPU accelerator): that it is
    supported, that its passes' comparison ops are known, that ``current_device()`` names a device torch takes, and
    that its profiler may fork the device's RNG; and its memory profiler and ZeRO-3's operator profiler left out."""
    import operator

    import deepspeed.compile.util as dc_util
    import deepspeed.runtime.engine as engine_module
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() == "cuda":
        return
    dc_util.sym_size_ops = {
        operator.ge, operator.le, operator.eq, operator.ne, operator.gt, operator.lt, torch.ops.aten.sym_size.int,
        operator.getitem
    }
    dc_util.is_deepcompile_supported = lambda: True
    engine_module.is_deepcompile_supported = lambda: True
    device = accelerator.current_device_name()
    accelerator.current_device = lambda: device

    class Random:

        def __getattr__(self, name):
            return getattr(torch.random, name)

        @staticmethod
        def fork_rng(devices=None, **kwargs):
            return torch.random.fork_rng(devices=[])

    accelerator.random = lambda: Random()

    # The memory profiler runs each compiled graph node by node with a collective per node, to record memory that
    # only ZeRO-3's prefetch and selective gather read. On 2 CPU ranks those collectives stalled now and then
    # (gloo: "Timed out waiting ... for send"); it records nothing here.
    import deepspeed.compile.backend as backend

    class NoMemoryProfile:
        profile_complete = False
        mem_record = []

        def __init__(self, *args, **kwargs):
            pass

        def run(self, *args):
            return None

    backend.MemoryProfilingInterpreter = NoMemoryProfile

    # ZeRO-3's operator profiler times each node with the device's events, which the CPU accelerator lacks: it fails
    # at the first node it times, and the pass goes on with default metadata for every node. It is left out with
    # that outcome, and without its collectives (on 2 loaded CPU ranks gloo stalled twice in one of them, both ranks in
    # the same all-reduce of a real tensor; not explained).
    import deepspeed.compile.passes.zero3_compile as zero3_compile
    from deepspeed.compile.profilers import graph_profile

    class NoOperatorProfile(graph_profile.ProfilingInterpreter):

        def run(self, *args):
            graph_profile._backfill_missing_profile_metadata(self.graph, profile_complete=False)
            return None

    zero3_compile.ProfilingInterpreter = NoOperatorProfile


def install(flush_empty_skipped=True, accumulate=True):
    """The stand-in as DeepCompile's native handle and as the ``torch.ops.dc`` ops DeepCompile's passes insert (defined
    once per process, with the native op's schemas); off CUDA, DeepCompile's Python made to run on the device.
    ``flush_empty_skipped=False``: the native op before patch Flush-only-the-DeepCompile-reduce-buckets-that-hold-;
    ``accumulate=False``: a control whose ZeRO-3 reductions overwrite the gradients of the step's earlier
    micro-batches. Returns the handle."""
    global _LIBRARY
    import deepspeed.compile.util as dc_util

    _run_on_this_device()
    # One handle per process, as the native op is one module: what an engine registered stays until the next
    # engine's init() replaces it.
    handle = dc_util.dc_handle if isinstance(dc_util.dc_handle, DeepCompileStandIn) else DeepCompileStandIn()
    handle.flush_empty_skipped = flush_empty_skipped
    handle.accumulate = accumulate
    dc_util.dc_handle = handle
    if _LIBRARY is None:
        library = torch.library.Library("dc", "DEF")
        schemas = [
            "allgather_param(Tensor a, int graph_id, int id, ScalarType? dtype = None) -> Tensor",
            "prefetch_params_fused(int graph_id, Tensor[] params, int[] ids, ScalarType[]? dtypes = None) -> ()",
            "wait_allgather(Tensor(a) a, int graph_id, int id) -> Tensor(a)",
            "release_param(Tensor(a) a, int graph_id, int id, int n_users) -> Tensor(a)",
            "reduce_grad(Tensor a, int graph_id, int id) -> Tensor",
            "free_tensors(Tensor[] a) -> ()",
            "offload_tensor(Tensor a, int id, int id) -> Tensor",
            "reload_tensor(Tensor a, int id, int id) -> Tensor",
            "wait_offload(Tensor a, int id, int id) -> Tensor",
            "wait_reload(Tensor a, int id, int id) -> Tensor",
            "offload_parameter(Tensor a, int id, int id) -> ()",
            "reload_parameter(Tensor a, int id, int id) -> ()",
            "end_backward(Any deps, int graph_id, bool release_reduce_buckets) -> ()",
            "test_call(Tensor a) -> Tensor",
        ]
        for schema in schemas:
            library.define(schema)

        def reduce_grad(grad, graph_id, ds_id):
            if _is_fake(grad):
                return grad.new_empty(0)
            return dc_util.dc_handle.reduce_grad(grad, graph_id, ds_id)

        def end_backward(deps, graph_id, release_reduce_buckets):
            if not _is_fake(deps):
                dc_util.dc_handle.end_backward(graph_id, release_reduce_buckets)

        def free_tensors(tensors):
            pass

        def allgather_param(param, graph_id, ds_id, dtype=None):
            registered = dc_util.dc_handle.params[ds_id]
            if _is_fake(param):
                return param.new_empty(registered.shape, dtype=dtype or registered.ds_tensor.dtype)
            return dc_util.dc_handle.allgather_param(ds_id, dtype)

        def passed_through(tensor, graph_id, ds_id, n_users=None):
            return tensor

        def prefetch_params_fused(graph_id, params, ds_ids, dtypes=None):
            pass  # the gather happens at allgather_param

        library.impl("reduce_grad", reduce_grad, "CompositeExplicitAutograd")
        library.impl("end_backward", end_backward, "CompositeExplicitAutograd")
        library.impl("free_tensors", free_tensors, "CompositeExplicitAutograd")
        library.impl("allgather_param", allgather_param, "CompositeExplicitAutograd")
        library.impl("wait_allgather", passed_through, "CompositeExplicitAutograd")
        library.impl("release_param", passed_through, "CompositeExplicitAutograd")
        library.impl("prefetch_params_fused", prefetch_params_fused, "CompositeExplicitAutograd")
        _LIBRARY = library
    return handle
