# Type stub of reloadsafe._C, the compiled core (python/src/module.cc). Use the
# typed wrappers in the `reloadsafe` package instead of these names.

import torch

TORCH_VERSION: str
GLIBCXX_USE_CXX11_ABI: bool
MAX_CASE_STORAGE_BYTES: int

def in_own_storage(old: torch.Tensor, new: torch.Tensor, whole_storage: bool = ...) -> torch.Tensor: ...
def storage_view(
    storage: torch.UntypedStorage, offset: int, shape: list[int], stride: list[int], dtype: torch.dtype
) -> torch.Tensor: ...
def extent(tensor: torch.Tensor) -> int: ...
def checked_extent(sizes: list[int], strides: list[int]) -> int | None: ...
def evaluate_case(line: str) -> str: ...
def is_case_line(line: str) -> bool: ...
def direct_reload_enabled() -> bool: ...

class DirectReloadContext:
    def __init__(self, enabled: bool = ...) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *args: object) -> None: ...

# The safetensors file loader (bind_file_loader.cc).
class FileLoader:
    def __init__(self, threads: int, chunk_bytes: int, ring_slots: int) -> None: ...
    def load_(self, paths: list[str], targets: list[tuple[str, tuple[torch.Tensor, int | None]]]) -> int: ...
    def counters(self) -> dict[str, int]: ...
    @property
    def threads(self) -> int: ...
    @property
    def chunk_bytes(self) -> int: ...
    @property
    def ring_slots(self) -> int: ...

# The read trace (bind_trace.cc).
class TensorRead:
    arg: int
    element: int
    arg_name: str
    written: bool
    external: bool
    allocation_epoch: int
    has_storage: bool
    subclass: bool
    object: int
    storage: int
    storage_data: int
    storage_nbytes: int
    data_ptr: int
    storage_offset: int
    sizes: list[int]
    strides: list[int]
    dtype: torch.dtype
    device: torch.device
    layout: str

class ObjectRead:
    arg: int
    arg_name: str
    class_name: str
    identity: int
    payload: int

class OpCall:
    name: str
    depth: int
    reads: list[TensorRead]
    objects: list[ObjectRead]

class ReadTrace:
    def __init__(self, nested: bool = ...) -> None: ...
    def stop(self) -> None: ...
    def ops(self) -> list[OpCall]: ...

# The reload protocol (bind_protocol.cc).
class ReloadMode:
    normal: ReloadMode
    direct: ReloadMode

class NamedTensor:
    def __init__(self, name: str, tensor: torch.Tensor, declared: bool = ...) -> None: ...
    name: str
    tensor: torch.Tensor
    declared: bool

class NamedObject:
    def __init__(self, name: str, obj: object) -> None: ...
    name: str
    identity: int

def object_identity(obj: object) -> int: ...
def live_tensor_bytes(device: torch.device) -> int | None: ...
def take_peak_tensor_bytes(device: torch.device) -> int | None: ...
class CpuCensus:
    def __init__(self) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *args: object) -> None: ...
def cpu_allocation_epoch() -> int | None: ...
def sparse_parts(tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None: ...
def begin_untraced() -> None: ...
def end_untraced() -> None: ...
def untraced() -> bool: ...
class StepSpec:
    name: str
    flag: str
    takes: str  # "switch", "level" or "bytes"
    max_level: int
    value: str  # as a usage line shows it: "", "1|2", "BYTES"
    kind: str  # "engine", "check" or "bound"
    help: str
    example: str

def step_table() -> list[StepSpec]: ...
def steps_markdown_table() -> str: ...

class ReloadSteps:
    def __init__(self) -> None: ...
    def set(self, name: str, value: int = ...) -> ReloadSteps: ...
    def get(self, name: str) -> int | None: ...
    def has(self, name: str) -> bool: ...
    def any(self) -> bool: ...
    def values(self) -> dict[str, int]: ...

def check_steps(steps: ReloadSteps) -> None: ...
def merge_steps(a: ReloadSteps, b: ReloadSteps) -> ReloadSteps: ...

class NamedNumber:
    def __init__(self, name: str, value: float, integral: bool = ...) -> None: ...
    name: str
    value: float
    integral: bool

class LayerState:
    def __init__(self, tensors: list[NamedTensor], numbers: list[NamedNumber]) -> None: ...
    tensors: list[NamedTensor]
    numbers: list[NamedNumber]

class StateDifference:
    name: str
    before: str
    after: str

def state_differences(live: LayerState, cold: LayerState) -> list[StateDifference]: ...
def format_number(number: NamedNumber) -> str: ...
def discard_storage(tensor: torch.Tensor, integer: int = ...) -> None: ...

class RunOptions:
    reloads: int
    device: torch.device
    seed: int
    max_listed: int
    trace: bool
    steps: ReloadSteps

DEFAULT_RELOADS: int

def reload_seed(seed: int, reload: int) -> int: ...

class Violation:
    reload: int
    tensor: str
    what: str
    before: str
    after: str
    read: str

class Warning:
    tensor: str
    read: str
    message: str

class ModeReport:
    mode: str
    expected_to_pass: bool
    reloads_done: int
    violation_count: int
    flagged: list[str]
    violations: list[Violation]
    warnings: list[Warning]
    declared_reads: int
    undeclared_reads: int
    memory_bytes: list[int]
    graph_replays: int
    error: str
    def clean(self) -> bool: ...

class BackendReport:
    name: str
    description: str
    negative_control: bool
    expected_violation: str
    modes: list[ModeReport]
    def ok(self) -> bool: ...

class SubjectInfo:
    def __init__(
        self,
        name: str,
        description: str = ...,
        modes: list[ReloadMode] = ...,
        negative_control: bool = ...,
        expected_violation: str = ...,
        memory_tolerance_bytes: int = ...,
        steps: ReloadSteps = ...,
    ) -> None: ...
    name: str
    description: str
    modes: list[ReloadMode]
    negative_control: bool
    expected_violation: str
    memory_tolerance_bytes: int
    steps: ReloadSteps
    warm_up_under_trace: bool
    free_names: list[str]
    constant_output_allowed: bool
    constant_output_hint: str

class SubjectLayer:
    """Derive in Python and override load, process, forward and
    named_tensors (and, where the layer has them, named_objects,
    named_numbers, parameters, buffers and sleep_and_wake): one layer a
    subject built."""
    def __init__(self) -> None: ...
    def named_objects(self) -> list[NamedObject]: ...
    def named_numbers(self) -> list[NamedNumber]: ...
    def parameters(self) -> list[torch.Tensor]: ...
    def buffers(self) -> list[torch.Tensor]: ...
    def sleep_and_wake(self, level: int) -> bool: ...

class ReloadSubject:
    """Derive in Python and override info, draw_checkpoint, draw_input and
    new_layer (and, where the layers share module caches, cache_tensors,
    empty_caches and restore_caches; where a layer can be copied more cheaply
    than built, copy_of_new_layer): a layer factory."""
    def __init__(self) -> None: ...
    def cache_tensors(self) -> list[NamedTensor]: ...
    def empty_caches(self) -> None: ...
    def restore_caches(self) -> None: ...

def layer_state(layer: SubjectLayer, caches: list[NamedTensor], free_names: list[str]) -> LayerState: ...
class CheckpointPools:
    def __init__(self, layouts: dict[str, torch.Tensor]) -> None: ...
    def draw(self, seed: int) -> dict[str, torch.Tensor]: ...
    @property
    def nbytes(self) -> int: ...

def run_subject(subject: ReloadSubject, options: RunOptions) -> BackendReport: ...
def to_json(reports: list[BackendReport], options: RunOptions) -> str: ...
def to_table(reports: list[BackendReport]) -> str: ...

def cuda_unavailable_reason() -> str: ...
