/*
 * A stand-in for the NVIDIA driver's libcuda.so.1, for machines without a GPU.
 *
 * It implements the handful of CUDA driver API entry points that gpu_p2p_facts
 * calls, over host memory, so the real measurement code runs unchanged. How it
 * behaves is set by environment variables, read at cuInit:
 *   FAKE_CUDA_DEVICES   number of GPUs (default 2)
 *   FAKE_CUDA_PEER      1: every pair reports peer access (default), 0: none
 *   FAKE_CUDA_MODE      what a copy with peer access enabled does on FAKE_CUDA_PAIR:
 *                       ok (default), drop (copies nothing), corrupt (flips a byte),
 *                       slow (takes 20x longer than a staged copy), hang (never returns)
 *   FAKE_CUDA_PAIR      "src-dst" the mode applies to (default: every pair)
 *   FAKE_CUDA_INIT_ERROR  when set, cuInit fails with CUDA_ERROR_NO_DEVICE (100)
 *   FAKE_CUDA_HOST_MODE what an asynchronous copy between host and FAKE_CUDA_HOST_GPU
 *                       does: ok (default), drop (copies nothing), hang (never returns)
 *   FAKE_CUDA_HOST_GPU  the GPU index the host mode applies to (default: every GPU)
 * Copies are synchronous; events record the wall clock, so timings are real
 * memcpy timings of this machine (plus the modes' delays).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct ctx { int device; int peer[64]; } *CUcontext;
typedef struct stream { int unused; } *CUstream;
typedef struct event { double t; } *CUevent;

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
       PEER_ALREADY_ENABLED = 704, PEER_NOT_ENABLED = 705 };

static int initialised, devices = 2, peer = 1;
static const char *mode = "ok";
static int pair_src = -1, pair_dst = -1;
static const char *host_mode = "ok";
static int host_gpu = -1;
static struct ctx contexts[64];

/* Device allocations remember their device so a copy knows which pair it is. */
struct alloc { CUdeviceptr ptr; size_t size; int device; struct alloc *next; };
static struct alloc *allocs;

static int device_of(CUdeviceptr p) {
    for (struct alloc *a = allocs; a; a = a->next)
        if (p >= a->ptr && p < a->ptr + a->size) return a->device;
    return -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (getenv("FAKE_CUDA_INIT_ERROR")) return NO_DEVICE;
    const char *v;
    if ((v = getenv("FAKE_CUDA_DEVICES"))) devices = atoi(v);
    if ((v = getenv("FAKE_CUDA_PEER"))) peer = atoi(v);
    if ((v = getenv("FAKE_CUDA_MODE"))) mode = v;
    if ((v = getenv("FAKE_CUDA_PAIR"))) sscanf(v, "%d-%d", &pair_src, &pair_dst);
    if ((v = getenv("FAKE_CUDA_HOST_MODE"))) host_mode = v;
    if ((v = getenv("FAKE_CUDA_HOST_GPU"))) host_gpu = atoi(v);
    for (int i = 0; i < 64; i++) contexts[i].device = i;
    initialised = 1;
    return OK;
}

CUresult cuDriverGetVersion(int *version) { *version = 12040; return OK; }
CUresult cuDeviceGetCount(int *count) { if (!initialised) return NOT_INITIALIZED; *count = devices; return OK; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= devices) return INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}
CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
    snprintf(bus, len, "0000:%02X:00.0", 0x10 * (dev + 1));
    return OK;
}
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice other) {
    *can = peer && dev != other;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) { *ctx = &contexts[dev]; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { (void)dev; return OK; }

static __thread CUcontext current;
CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return OK; }
CUresult cuCtxEnablePeerAccess(CUcontext peer_ctx, unsigned int flags) {
    (void)flags;
    if (current->peer[peer_ctx->device]) return PEER_ALREADY_ENABLED;
    current->peer[peer_ctx->device] = 1;
    return OK;
}
CUresult cuCtxDisablePeerAccess(CUcontext peer_ctx) {
    if (!current->peer[peer_ctx->device]) return PEER_NOT_ENABLED;
    current->peer[peer_ctx->device] = 0;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    void *p = malloc(size);
    if (!p) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    struct alloc *a = malloc(sizeof *a);
    *a = (struct alloc){ (CUdeviceptr)(uintptr_t)p, size, current->device, allocs };
    allocs = a;
    *ptr = a->ptr;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    for (struct alloc **a = &allocs; *a; a = &(*a)->next)
        if ((*a)->ptr == ptr) { struct alloc *dead = *a; *a = dead->next; free((void *)(uintptr_t)ptr); free(dead); return OK; }
    return INVALID_VALUE;
}
CUresult cuMemAllocHost_v2(void **p, size_t size) { *p = malloc(size); return *p ? OK : 2; }
CUresult cuMemFreeHost(void *p) { free(p); return OK; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return OK; }

/* Host <-> device copies on a stream, where FAKE_CUDA_HOST_MODE applies. */
static CUresult host_copy(void *dst, const void *src, size_t n, int device) {
    if ((host_gpu < 0 || host_gpu == device) && strcmp(host_mode, "ok")) {
        if (!strcmp(host_mode, "drop")) return OK;
        if (!strcmp(host_mode, "hang")) for (;;) pause();
        return INVALID_VALUE;
    }
    memcpy(dst, src, n);
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    return host_copy((void *)(uintptr_t)dst, src, n, device_of(dst));
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return host_copy(dst, (void *)(uintptr_t)src, n, device_of(src));
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n, CUstream s) {
    (void)s;
    int from = src_ctx->device, to = dst_ctx->device;
    int direct = src_ctx->peer[to] || dst_ctx->peer[from];
    int targeted = pair_src < 0 || (pair_src == from && pair_dst == to);
    if (device_of(src) != from || device_of(dst) != to) return INVALID_VALUE;
    if (!direct || !targeted || !strcmp(mode, "ok")) {
        memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
        if (!direct) { /* staged through host memory: a second pass */
            char *bounce = malloc(n);
            memcpy(bounce, (void *)(uintptr_t)src, n);
            memcpy((void *)(uintptr_t)dst, bounce, n);
            free(bounce);
        }
        return OK;
    }
    if (!strcmp(mode, "drop")) return OK;
    if (!strcmp(mode, "corrupt")) {
        memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
        ((unsigned char *)(uintptr_t)dst)[n / 2] ^= 0x5a;
        return OK;
    }
    if (!strcmp(mode, "slow")) {
        double start = now();
        memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
        double spent = now() - start;
        usleep((useconds_t)(spent * 20 * 1e6) + 20);
        return OK;
    }
    if (!strcmp(mode, "hang")) for (;;) pause();
    return INVALID_VALUE;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) { (void)flags; *s = calloc(1, sizeof **s); return OK; }
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return OK; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return OK; }
CUresult cuEventCreate(CUevent *e, unsigned int flags) { (void)flags; *e = calloc(1, sizeof **e); return OK; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return OK; }
CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; e->t = now(); return OK; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return OK; }
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) { *ms = (float)((end->t - start->t) * 1e3); return OK; }
CUresult cuGetErrorString(CUresult error, const char **text) {
    static char buffer[64];
    snprintf(buffer, sizeof buffer, "fake CUDA error %d", error);
    *text = buffer;
    return OK;
}
