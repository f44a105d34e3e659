"""CUDA IPC for the Python client, through the driver API (libcuda, ctypes): no torch or
cupy needed, any object with __cuda_array_interface__ (or a torch tensor) works.

Lending (Client.register): the handle of the allocation that holds the tensor (caching
allocators hand out pieces of bigger allocations) plus the tensor's offset in it, as the
daemon's Import expects. Mapping (Client.open): cuIpcOpenMemHandle of an exported buffer."""
from __future__ import annotations

import ctypes
import threading

import grpc

from gpumove._types import Error
from gpumove.v1 import gpumove_pb2 as pb

_lock = threading.Lock()
_lib = None


class _IpcMemHandle(ctypes.Structure):
    # CUipcMemHandle: 64 bytes, passed by value to cuIpcOpenMemHandle.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def _driver():
    global _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                            f"CUDA IPC needs the CUDA driver (libcuda.so.1): {e}") from None
            _check(lib.cuInit(0), "cuInit")
            _lib = lib
        return _lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise Error(grpc.StatusCode.INTERNAL, f"{what}: CUDA driver error {rc}")


# DLPack's C structures (dlpack.h, ABI stable since v0.2): what __dlpack__() returns in a
# PyCapsule named "dltensor".
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13


def dlpack_capsule(ptr: int, size: int, device_type: int, device_id: int, keep: list):
    """A "dltensor" PyCapsule over `size` bytes at `ptr` (a 1-D uint8 tensor) for a DLPack
    consumer (torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack). No deleter:
    the memory is not the consumer's to free; the structures are kept alive in `keep`
    (the caller's, which must outlive the consumer's tensor, as the mapping must)."""
    shape = (ctypes.c_int64 * 1)(size)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = ptr
    managed.dl_tensor.device = _DLDevice(device_type, device_id)
    managed.dl_tensor.ndim = 1
    managed.dl_tensor.dtype = _DLDataType(1, 8, 1)  # kDLUInt, 8 bits, 1 lane.
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = None
    keep.extend([shape, managed])
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(managed), b"dltensor", None)


_DL_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                    10: "ROCm", 13: "CUDA managed"}


def _elements_checked_contiguous(shape, strides, unit: int) -> int:
    """The element count of a tensor of `shape`, INVALID_ARGUMENT unless its `strides`
    (None: row-major) describe a row-major contiguous layout; `unit` is what a stride counts
    (bytes for __cuda_array_interface__, elements for DLPack). Sizes of 1 ignore strides."""
    count = 1
    for s in shape:
        count *= s
    if strides is not None and count > 1:
        step = unit
        for s, st in zip(reversed(list(shape)), reversed(list(strides))):
            if s > 1 and st != step:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, "register takes contiguous tensors")
            step *= s
    return count


def dlpack_pointer(tensor) -> tuple:
    """(device type, device pointer, bytes) of an object with __dlpack__ (jax, torch,
    cupy, numpy, ...), read from its DLPack capsule without taking it over: the capsule's
    own destructor gives the tensor back to its producer."""
    try:
        capsule = tensor.__dlpack__(stream=None)
    except TypeError:
        capsule = tensor.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    try:
        address = get(capsule, b"dltensor")
    except ValueError:
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    "__dlpack__ gave no unused 'dltensor' capsule") from None
    # DLManagedTensor starts with its DLTensor.
    t = _DLTensor.from_address(address)
    kind = t.device.device_type
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None
    count = _elements_checked_contiguous(shape, strides, 1)
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    ptr = (t.data or 0) + t.byte_offset
    del t, capsule  # The capsule's destructor calls the producer's deleter (it is unused).
    return kind, ptr, count * itemsize


def device_pointer(tensor) -> tuple:
    """(device pointer, bytes) of a CUDA tensor: __cuda_array_interface__ (torch, cupy,
    numba), else DLPack (__dlpack__: jax and the rest)."""
    cai = getattr(tensor, "__cuda_array_interface__", None)
    if cai is None and hasattr(tensor, "__dlpack__"):
        kind, ptr, size = dlpack_pointer(tensor)
        if kind not in (_DL_CUDA, _DL_CUDA_MANAGED):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                        f"register takes a CUDA tensor; this one lives on "
                        f"{_DL_DEVICE_NAMES.get(kind, f'DLPack device type {kind}')}")
        return ptr, size
    if cai is None:
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    "register takes a CUDA tensor (__cuda_array_interface__ or __dlpack__: "
                    "torch, cupy, jax, ...)")
    itemsize = int(cai["typestr"][2:])
    count = _elements_checked_contiguous(cai["shape"], cai.get("strides"), itemsize)
    return cai["data"][0], count * itemsize


def _uuid(lib, ordinal: int) -> str:
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    _check(lib.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _use_context(lib, ordinal: int) -> None:
    # Driver calls need a current context: the GPU's primary one, as torch and cupy use.
    current = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value:
        return
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def import_request(tensor, label: str = "") -> pb.ImportRequest:
    ptr, size = device_pointer(tensor)
    if size == 0:
        raise Error(grpc.StatusCode.INVALID_ARGUMENT, "an empty tensor has no bytes to lend")
    lib = _driver()
    ordinal = ctypes.c_int()
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    _check(lib.cuPointerGetAttribute(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     ctypes.c_uint64(ptr)), "cuPointerGetAttribute")
    _use_context(lib, ordinal.value)
    base = ctypes.c_uint64()
    alloc = ctypes.c_size_t()
    _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(alloc),
                                       ctypes.c_uint64(ptr)), "cuMemGetAddressRange")
    handle = _IpcMemHandle()
    _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
    return pb.ImportRequest(cuda_ipc_handle=bytes(handle.reserved), offset=ptr - base.value,
                            size=size,
                            device_uuid=_uuid(lib, ordinal.value), label=label)


class DeviceMemory:
    """A daemon buffer mapped into this process: `ptr`, `size`, `device`,
    __cuda_array_interface__ (a 1-D uint8 array) and DLPack (__dlpack__), so
    torch.as_tensor(m, device="cuda"), torch.from_dlpack(m), cupy.asarray(m) or
    jax.dlpack.from_dlpack(m) see it without a copy. close() unmaps it (keep it open while a tensor
    over it is used)."""

    def __init__(self, base: int, offset: int, size: int, device: int):
        self._base = base
        self.ptr = base + offset
        self.size = size
        self.device = device
        self._dlpack = []  # DLPack structures handed out, alive as long as this object.

    @classmethod
    def open(cls, r: pb.ExportResponse) -> "DeviceMemory":
        lib = _driver()
        _use_context(lib, r.device)
        if len(r.cuda_ipc_handle) != 64:
            raise Error(grpc.StatusCode.INTERNAL, "the daemon sent a handle of "
                        f"{len(r.cuda_ipc_handle)} bytes, not 64")
        handle = _IpcMemHandle.from_buffer_copy(r.cuda_ipc_handle)
        base = ctypes.c_uint64()
        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcMemHandle,
                                              ctypes.c_uint]
        _check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(base), handle,
                                         CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
        return cls(base.value, r.offset, r.size, r.device)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False),
                "version": 3, "strides": None}

    def __dlpack__(self, stream=None):
        """DLPack (torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack): a 1-D
        uint8 tensor over the mapping. The daemon's copies are done before Export and moves
        answer, so there is no stream to wait on."""
        if not self._base:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, "the mapping is closed")
        return dlpack_capsule(self.ptr, self.size, _DL_CUDA, self.device, self._dlpack)

    def __dlpack_device__(self):
        return (_DL_CUDA, self.device)

    def close(self) -> None:
        if self._base:
            _check(_driver().cuIpcCloseMemHandle(ctypes.c_uint64(self._base)),
                   "cuIpcCloseMemHandle")
            self._base = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
