/*
 * cuda_async.cu -- transfers that do not wait, fences, and the device-side resolution of
 * pending token ids: what the engine's overlap loop needs to enqueue decode step N + 1 while
 * step N still runs (backend.h: upload_async .. resolve_ids).
 *
 * Why staging: a copy from pageable host memory is synchronous for the host, and a copy to it
 * too, so both go through pinned buffers the backend owns. Each direction has one pinned area
 * in two halves. Copies fill the current half; when the next one does not fit, the other half
 * becomes current, after waiting for the last copy that used it (an event recorded after
 * every copy). At the decode step's sizes (ids, rope rows, block tables: kilobytes) that wait
 * has long passed. A transfer larger than a half is not staged: the caller then copies
 * synchronously, which is correct, only not overlapped.
 *
 * Downloads land in staging first and reach the caller's buffer when fence_wait (or a full
 * sync) sees them done: a list of (destination, staged bytes, fence ticket) entries.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <stdlib.h>
#include <string.h>

#define ASYNC_HALF      ((size_t)4 << 20) /* bytes per half of each direction's staging */
#define ASYNC_FENCES    8                 /* fence events reused round robin */
#define ASYNC_DOWNLOADS 64                /* downloads awaiting their fence */

struct staging { /* one direction's pinned area */
    char *host;  /* 2 ASYNC_HALF bytes, pinned */
    int half;    /* the current half */
    size_t used; /* bytes taken in it */
    cudaEvent_t last[2];
    bool recorded[2];
};

struct pending_download {
    void *dst;
    const char *staged;
    size_t bytes;
    int half;
    int64_t ticket; /* the first fence after the copy */
};

struct di_cuda_async {
    staging up, down;
    cudaEvent_t fences[ASYNC_FENCES];
    /* the first error of the ops before each fence, so that a wait reports its own step's
     * errors, not those of the step queued behind it */
    cudaError_t fence_errors[ASYNC_FENCES];
    int64_t n_fences;
    pending_download pend[ASYNC_DOWNLOADS];
    int n_pend;
};

static cudaError_t staging_init(staging *s) {
    cudaError_t err = cudaHostAlloc((void **)&s->host, 2 * ASYNC_HALF, cudaHostAllocDefault);
    for (int h = 0; h < 2 && err == cudaSuccess; h++)
        err = cudaEventCreateWithFlags(&s->last[h], cudaEventDisableTiming);
    return err;
}

static void staging_free(staging *s) {
    for (int h = 0; h < 2; h++)
        if (s->last[h]) cudaEventDestroy(s->last[h]);
    if (s->host) cudaFreeHost(s->host);
}

cudaError_t di_cuda_async_create(di_cuda_async **out) {
    di_cuda_async *a = (di_cuda_async *)calloc(1, sizeof *a);
    *out = a;
    if (!a) return cudaErrorMemoryAllocation;
    cudaError_t err = staging_init(&a->up);
    if (err == cudaSuccess) err = staging_init(&a->down);
    for (int i = 0; i < ASYNC_FENCES && err == cudaSuccess; i++)
        err = cudaEventCreateWithFlags(&a->fences[i], cudaEventDisableTiming);
    return err;
}

void di_cuda_async_free(di_cuda_async *a) {
    if (!a) return;
    staging_free(&a->up);
    staging_free(&a->down);
    for (int i = 0; i < ASYNC_FENCES; i++)
        if (a->fences[i]) cudaEventDestroy(a->fences[i]);
    free(a);
}

/* Copies the staged downloads of tickets <= ticket (INT64_MAX: all), and those staged in
 * half `half` (-1: none), to their destinations; their copies must have completed. */
static void hand_over(di_cuda_async *a, int64_t ticket, int half) {
    int kept = 0;
    for (int i = 0; i < a->n_pend; i++) {
        pending_download *p = &a->pend[i];
        if (p->ticket <= ticket || p->half == half)
            memcpy(p->dst, p->staged, p->bytes);
        else
            a->pend[kept++] = *p;
    }
    a->n_pend = kept;
}

/* Room for `bytes` in s (NULL if they can never fit): switches halves when the current one is
 * full, after the last copy through the other half has completed (and, for downloads, after
 * its staged bytes were handed over). */
static char *staging_take(di_cuda_async *a, staging *s, size_t bytes, cudaError_t *err) {
    const size_t need = (bytes + 15) & ~(size_t)15;
    if (need > ASYNC_HALF) return NULL;
    if (s->used + need > ASYNC_HALF) {
        const int other = 1 - s->half;
        if (s->recorded[other]) *err = cudaEventSynchronize(s->last[other]);
        if (*err != cudaSuccess) return NULL;
        if (s == &a->down) hand_over(a, 0, other); /* the other half's downloads are done */
        s->half = other;
        s->used = 0;
    }
    char *p = s->host + (size_t)s->half * ASYNC_HALF + s->used;
    s->used += need;
    return p;
}

cudaError_t di_cuda_async_upload(di_cuda_async *a, cudaStream_t stream, void *dst, const void *src,
                                 size_t bytes, bool *staged) {
    cudaError_t err = cudaSuccess;
    char *p = bytes ? staging_take(a, &a->up, bytes, &err) : NULL;
    *staged = p != NULL;
    if (!p) return err;
    memcpy(p, src, bytes);
    err = cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) err = cudaEventRecord(a->up.last[a->up.half], stream);
    a->up.recorded[a->up.half] = err == cudaSuccess;
    return err;
}

cudaError_t di_cuda_async_download(di_cuda_async *a, cudaStream_t stream, void *dst,
                                   const void *src, size_t bytes, bool *staged) {
    cudaError_t err = cudaSuccess;
    char *p = bytes && a->n_pend < ASYNC_DOWNLOADS ? staging_take(a, &a->down, bytes, &err) : NULL;
    *staged = p != NULL;
    if (!p) return err;
    err = cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaEventRecord(a->down.last[a->down.half], stream);
    a->down.recorded[a->down.half] = err == cudaSuccess;
    if (err == cudaSuccess)
        a->pend[a->n_pend++] = pending_download{dst, p, bytes, a->down.half, a->n_fences + 1};
    return err;
}

int64_t di_cuda_async_fence(di_cuda_async *a, cudaStream_t stream, cudaError_t ops_error) {
    const int64_t ticket = ++a->n_fences;
    const cudaError_t err = cudaEventRecord(a->fences[ticket % ASYNC_FENCES], stream);
    a->fence_errors[ticket % ASYNC_FENCES] = ops_error != cudaSuccess ? ops_error : err;
    return ticket;
}

/* A ticket older than the last ASYNC_FENCES shares its event with a later fence: waiting for
 * that one waits longer, never shorter. */
cudaError_t di_cuda_async_wait(di_cuda_async *a, int64_t ticket) {
    if (ticket <= 0 || ticket > a->n_fences) return cudaErrorInvalidValue;
    const cudaError_t err = cudaEventSynchronize(a->fences[ticket % ASYNC_FENCES]);
    if (err == cudaSuccess) hand_over(a, ticket, -1);
    cudaError_t *parked = &a->fence_errors[ticket % ASYNC_FENCES];
    const cudaError_t first = *parked != cudaSuccess ? *parked : err;
    *parked = cudaSuccess;
    return first;
}

cudaError_t di_cuda_async_synced(di_cuda_async *a) {
    hand_over(a, INT64_MAX, -1);
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < ASYNC_FENCES; i++) { /* fences nobody waited for */
        if (first == cudaSuccess) first = a->fence_errors[i];
        a->fence_errors[i] = cudaSuccess;
    }
    return first;
}

/* ---------------------------------------------------------------------------------------- */
/* Pending ids                                                                                */
/* ---------------------------------------------------------------------------------------- */

__global__ void resolve_ids_kernel(int32_t *ids, int64_t n, const int32_t *prev) {
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && ids[i] < 0) {
        const int32_t t = prev[-1 - (int64_t)ids[i]];
        ids[i] = t < 0 ? 0 : t; /* a row the host reports (NaN logits): any valid id */
    }
    pdl_trigger();
}

cudaError_t di_cuda_launch_resolve_ids(int32_t *ids, int64_t n, const int32_t *prev,
                                       cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const int threads = 256;
    return di_cuda_launch(resolve_ids_kernel, dim3((unsigned)((n + threads - 1) / threads)),
                          dim3(threads), 0, stream, ids, n, prev);
}
