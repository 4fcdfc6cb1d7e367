#!/usr/bin/python3
"""Debian's unmodified PyOpenCL against whichever OpenCL platform the loader finds first
named $RACCEL_TEST_PLATFORM (default 'raccel'): arrays, elementwise kernels,
reductions, scans, events, user events, profiling, build errors and argument errors.
Prints one line per check and 'N passed, N failed' at the end; exits 1 on a failure."""
import os
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.reduction as clr
import pyopencl.scan as cls
from pyopencl.elementwise import ElementwiseKernel

name = os.environ.get("RACCEL_TEST_PLATFORM", "raccel")
platforms = [p for p in cl.get_platforms() if p.name == name]
if not platforms:
    print(f"no OpenCL platform named {name!r}: {[p.name for p in cl.get_platforms()]}")
    sys.exit(2)
device = platforms[0].get_devices()[0]
ctx = cl.Context([device])
queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
rng = np.random.default_rng(7)
results = []


def check(label, fn):
    try:
        fn()
        results.append(True)
        print(f"ok   {label}")
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        results.append(False)
        print(f"FAIL {label}: {type(e).__name__}: {e}")


def arrays():
    a = rng.random(100_003, dtype=np.float32)
    b = rng.random(100_003, dtype=np.float32)
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    np.testing.assert_allclose((da + db).get(), a + b, rtol=1e-6)
    np.testing.assert_allclose((da * 3 - db / 2).get(), a * 3 - b / 2, rtol=1e-5)
    z = cla.zeros(queue, 1000, np.int32)
    z.fill(7)
    assert (z.get() == 7).all()
    np.testing.assert_allclose(da[10:20].get(), a[10:20])


def elementwise():
    k = ElementwiseKernel(ctx, "float *x, float *y, float a, float *z", "z[i] = a * x[i] + y[i]", "saxpy")
    x, y = rng.random(50_000, dtype=np.float32), rng.random(50_000, dtype=np.float32)
    dx, dy = cla.to_device(queue, x), cla.to_device(queue, y)
    dz = cla.empty_like(dx)
    k(dx, dy, np.float32(2.5), dz)
    np.testing.assert_allclose(dz.get(), 2.5 * x + y, rtol=1e-6)


def reductions():
    x = rng.random(200_000, dtype=np.float32)
    dx = cla.to_device(queue, x)
    assert abs(cla.sum(dx).get() - x.sum(dtype=np.float64)) < 1e-2 * len(x) * 1e-4 + 1
    assert cla.max(dx).get() == x.max()
    dot = clr.ReductionKernel(ctx, np.float32, neutral="0", reduce_expr="a+b", map_expr="x[i]*y[i]",
                              arguments="__global const float *x, __global const float *y")
    got = dot(dx, dx).get()
    want = float((x.astype(np.float64) ** 2).sum())
    assert abs(got - want) / want < 1e-4, (got, want)


def scans():
    x = rng.integers(0, 100, 30_000).astype(np.int32)
    dx = cla.to_device(queue, x)
    scan = cls.InclusiveScanKernel(ctx, np.int32, "a+b", neutral="0")
    scan(dx)
    assert (dx.get() == np.cumsum(x)).all()
    ex = cls.ExclusiveScanKernel(ctx, np.int32, "a+b", "0")
    dy = cla.to_device(queue, x)
    ex(dy)
    assert (dy.get() == np.concatenate([[0], np.cumsum(x)[:-1]])).all()


def events():
    prg = cl.Program(ctx, "__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }").build()
    buf = cla.zeros(queue, 4096, np.int32)
    user = cl.UserEvent(ctx)
    held = prg.inc(queue, (4096,), None, buf.data, wait_for=[user])
    assert held.command_execution_status != cl.command_execution_status.COMPLETE
    done = []
    held.set_callback(cl.command_execution_status.COMPLETE, lambda status: done.append(status))
    user.set_status(cl.command_execution_status.COMPLETE)
    held.wait()
    assert held.command_execution_status == cl.command_execution_status.COMPLETE
    ev = prg.inc(queue, (4096,), (64,), buf.data)
    marker = cl.enqueue_marker(queue, wait_for=[ev])
    marker.wait()
    assert (buf.get() == 2).all()
    assert ev.profile.end >= ev.profile.start >= ev.profile.submit >= ev.profile.queued
    queue.finish()
    assert done == [cl.command_execution_status.COMPLETE], done
    # Two commands held behind two user events: setting the first sends only the first.
    first, second = cl.UserEvent(ctx), cl.UserEvent(ctx)
    a = prg.inc(queue, (4096,), None, buf.data, wait_for=[first])
    b = prg.inc(queue, (4096,), None, buf.data, wait_for=[second])
    first.set_status(cl.command_execution_status.COMPLETE)
    a.wait()
    assert b.command_execution_status == cl.command_execution_status.QUEUED
    second.set_status(cl.command_execution_status.COMPLETE)
    b.wait()
    assert (buf.get() == 4).all()
    # A user event that fails fails what waits for it; the kernel never runs.
    failing = cl.UserEvent(ctx)
    c = prg.inc(queue, (4096,), None, buf.data, wait_for=[failing])
    failing.set_status(-1)
    assert c.command_execution_status < 0, c.command_execution_status
    queue.finish()
    assert (buf.get() == 4).all()


def kernel_metadata():
    src = """
    typedef struct { float scale; int shift; } params;
    __kernel __attribute__((reqd_work_group_size(16, 1, 1)))
    void k(__global float *out, __constant float *in, __local float *tmp, const params p, uint n) {
      size_t i = get_global_id(0);
      tmp[get_local_id(0)] = in[i] * p.scale + p.shift;
      barrier(CLK_LOCAL_MEM_FENCE);
      if (i < n) out[i] = tmp[get_local_id(0)];
    }"""
    prg = cl.Program(ctx, src).build()
    k = prg.k
    assert k.num_args == 5
    assert k.get_arg_info(0, cl.kernel_arg_info.NAME) == "out"
    assert k.get_arg_info(1, cl.kernel_arg_info.ADDRESS_QUALIFIER) == cl.kernel_arg_address_qualifier.CONSTANT
    assert k.get_arg_info(2, cl.kernel_arg_info.ADDRESS_QUALIFIER) == cl.kernel_arg_address_qualifier.LOCAL
    assert k.get_arg_info(4, cl.kernel_arg_info.TYPE_NAME) == "uint"
    assert k.get_work_group_info(cl.kernel_work_group_info.COMPILE_WORK_GROUP_SIZE, device) == [16, 1, 1]
    params = np.array([(2.0, 3)], dtype=[("scale", np.float32), ("shift", np.int32)])
    x = rng.random(64, dtype=np.float32)
    dx = cla.to_device(queue, x)
    out = cla.empty_like(dx)
    k(queue, (48,), (16,), out.data, dx.data, cl.LocalMemory(16 * 4), params, np.uint32(64), global_offset=(16,))
    got = out.get()
    np.testing.assert_allclose(got[16:], x[16:] * 2 + 3, rtol=1e-6)


def bad_input():
    try:
        cl.Program(ctx, "__kernel void broken(__global int *x) { x[0] = undefined_thing; }").build()
        raise AssertionError("the build did not fail")
    except cl.RuntimeError as e:
        assert "undefined_thing" in str(e), str(e)
    prg = cl.Program(ctx, "__kernel void two(__global int *x, int v) { x[0] = v; }").build()
    k = prg.two
    try:
        k.set_arg(5, np.int32(1))
        raise AssertionError("a wrong index was accepted")
    except cl.LogicError as e:
        assert e.code == cl.status_code.INVALID_ARG_INDEX, e
    try:
        k.set_arg(1, np.int64(1))
        raise AssertionError("a wrong size was accepted")
    except cl.LogicError as e:
        assert e.code == cl.status_code.INVALID_ARG_SIZE, e


def buffers():
    a = np.arange(4096, dtype=np.uint8)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
    sub = buf.get_sub_region(1024, 1024)
    out = np.empty(1024, np.uint8)
    cl.enqueue_copy(queue, out, sub)
    assert (out == a[1024:2048]).all()
    mapped, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (4096,), np.uint8)
    assert (mapped == a).all()
    mapped[:10] = 99
    del mapped
    queue.finish()
    back = np.empty(4096, np.uint8)
    cl.enqueue_copy(queue, back, buf)
    assert (back[:10] == 99).all() and (back[10:] == a[10:]).all()
    pat = np.array([1, 2, 3, 4], dtype=np.uint8)
    cl.enqueue_fill_buffer(queue, buf, pat, 0, 4096)
    cl.enqueue_copy(queue, back, buf)
    assert (back == np.tile(pat, 1024)).all()


for label, fn in [("arrays", arrays), ("elementwise kernels", elementwise), ("reductions", reductions), ("scans", scans),
                  ("events, user events, callbacks, markers, profiling", events),
                  ("kernel argument metadata, __local, structs by value, offsets", kernel_metadata),
                  ("buffers: sub-buffers, map/unmap, pattern fill", buffers),
                  ("bad input: build error log, argument index and size", bad_input)]:
    check(label, fn)
print(f"{results.count(True)} passed, {results.count(False)} failed")
sys.exit(0 if all(results) else 1)
