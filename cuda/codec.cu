/* codec.cu — see codec.h. The wire layout is src/codec.c's: the codes
 * (4, 2, 1 or 1/2 bytes per value), then for int8 and fp4 one float scale
 * per block. Every value's arithmetic is src/codec_math.h's. */
#include "codec.h"
#include "check.h"
#include "layers.h" /* cuda_to_bf16 */

#include <stdint.h>
#include <string.h>

extern "C" {
#include "codec_math.h"
#include "status.h"
}

#define THREADS 256

static unsigned grid_for(size_t n)
{
    const size_t g = (n + THREADS - 1) / THREADS;
    return (unsigned)(g < 4096 ? (g ? g : 1) : 4096);
}

/* val += residual, value by value (val = x + 0 without feedback, as the host). */
__global__ static void add_residual(float *val, const float *res, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        val[i] = codec_add(val[i], res ? res[i] : 0.0f);
}

/* One codec block per thread block (grid-stride over blocks): the largest
 * magnitude over the largest code. fmaxf is exact, so the order of the
 * tree does not matter. */
__global__ static void block_scales(float *scale, const float *val, size_t n, int block, float max_code)
{
    __shared__ float m[THREADS];
    const size_t blocks = (n + (size_t)block - 1) / (size_t)block;
    for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        const size_t b0 = b * (size_t)block, end = b0 + (size_t)block < n ? b0 + (size_t)block : n;
        float a = 0.0f;
        for (size_t i = b0 + threadIdx.x; i < end; i += blockDim.x) a = fmaxf(a, fabsf(val[i]));
        m[threadIdx.x] = a;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) m[threadIdx.x] = fmaxf(m[threadIdx.x], m[threadIdx.x + s]);
            __syncthreads();
        }
        if (threadIdx.x == 0) scale[b] = codec_div(m[0], max_code);
        __syncthreads();
    }
}

__global__ static void encode_int8(int8_t *codes, const float *val, const float *scale, size_t n, int block)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float s = scale[i / (size_t)block];
        codes[i] = codec_int8_code(s > 0 ? codec_div(val[i], s) : 0.0f);
    }
}

/* One byte per thread: values 2j (low nibble) and 2j+1 (high), each with
 * its own block's scale (a byte may straddle two blocks when block is odd). */
__global__ static void encode_fp4(unsigned char *codes, const float *val, const float *scale, size_t n, int block)
{
    const size_t bytes = (n + 1) / 2;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < bytes; j += (size_t)gridDim.x * blockDim.x) {
        unsigned byte = 0;
        for (size_t i = 2 * j; i < 2 * j + 2 && i < n; i++) {
            const float s = scale[i / (size_t)block];
            const unsigned code = s > 0 ? codec_fp4_code(codec_div(val[i], s)) : 0u;
            byte |= code << (4 * (i & 1));
        }
        codes[j] = (unsigned char)byte;
    }
}

__device__ static float decode_one(Codec c, const unsigned char *codes, const float *scale, const float *val,
                                   size_t i, int block)
{
    switch (c) {
    case CODEC_NONE: return val[i];
    case CODEC_BF16: return codec_from_bf16(((const uint16_t *)codes)[i]);
    case CODEC_INT8: return codec_int8_value(((const int8_t *)codes)[i], scale[i / (size_t)block]);
    case CODEC_FP4: return codec_fp4_value((codes[i / 2] >> (4 * (i & 1))) & 15u, scale[i / (size_t)block]);
    case CODEC_TOPK: break; /* the host's (cuda_codec_encode_ef refuses it) */
    }
    return 0.0f;
}

/* Decode, keep what the codec dropped (residual = val - decoded), and the
 * partial sums of the squared error and of val^2: CUDA_CODEC_PARTS blocks,
 * each reducing its threads' sums in a fixed tree. */
__global__ static void decode_finish(float *dec, float *res, const float *val, const unsigned char *codes,
                                     const float *scale, size_t n, int block, Codec c, double *part)
{
    __shared__ double e2[THREADS], n2[THREADS];
    double ee = 0.0, nn = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = val[i], d = decode_one(c, codes, scale, val, i, block);
        dec[i] = d;
        nn += (double)v * v;
        if (res) {
            const float r = codec_sub(v, d);
            res[i] = r;
            ee += (double)r * r;
        } else {
            const double r = (double)v - d;
            ee += r * r;
        }
    }
    e2[threadIdx.x] = ee;
    n2[threadIdx.x] = nn;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            e2[threadIdx.x] += e2[threadIdx.x + s];
            n2[threadIdx.x] += n2[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = e2[0];
        part[2 * blockIdx.x + 1] = n2[0];
    }
}

extern "C" void cuda_codec_init(CudaCodec *cc, cudaStream_t stream)
{
    memset(cc, 0, sizeof *cc);
    cc->stream = stream;
}

static void free_buffers(CudaCodec *cc)
{
    if (cc->d_val) cudaFree(cc->d_val);
    if (cc->d_res) cudaFree(cc->d_res);
    if (cc->d_dec) cudaFree(cc->d_dec);
    if (cc->d_scale) cudaFree(cc->d_scale);
    if (cc->d_codes) cudaFree(cc->d_codes);
    if (cc->d_part) cudaFree(cc->d_part);
    if (cc->h_stage) cudaFreeHost(cc->h_stage);
    cc->d_val = cc->d_res = cc->d_dec = cc->d_scale = NULL;
    cc->d_codes = NULL;
    cc->d_part = NULL;
    cc->h_stage = NULL;
    cc->cap = cc->h_cap = 0;
}

extern "C" void cuda_codec_destroy(CudaCodec *cc)
{
    if (cc->stream) cudaStreamSynchronize(cc->stream);
    free_buffers(cc);
}

/* Pinned staging: values and residual in (8n bytes), then the codes, the
 * scales, the decoded values, the residual and the partial sums out. */
static size_t part_offset(size_t n) { return (20 * n + 15) / 16 * 16; }
static size_t stage_bytes(size_t n) { return part_offset(n) + 16 * CUDA_CODEC_PARTS; }

static int reserve(CudaCodec *cc, size_t n)
{
    if (n <= cc->cap) return ISTH_OK;
    cudaStreamSynchronize(cc->stream);
    free_buffers(cc);
    const size_t f = sizeof(float) * n;
    CHECK_CUDA(cudaMalloc((void **)&cc->d_val, f));
    CHECK_CUDA(cudaMalloc((void **)&cc->d_res, f));
    CHECK_CUDA(cudaMalloc((void **)&cc->d_dec, f));
    CHECK_CUDA(cudaMalloc((void **)&cc->d_scale, f));
    CHECK_CUDA(cudaMalloc((void **)&cc->d_codes, f));
    CHECK_CUDA(cudaMalloc((void **)&cc->d_part, sizeof(double) * 2 * CUDA_CODEC_PARTS));
    CHECK_CUDA(cudaHostAlloc((void **)&cc->h_stage, stage_bytes(n), cudaHostAllocDefault));
    cc->cap = n;
    cc->h_cap = stage_bytes(n);
    return ISTH_OK;
}

/* Copies in, the kernels, copies out: queued on the codec's stream. */
static int enqueue(CudaCodec *cc, Codec c, int feedback, size_t n, int block, size_t blocks, size_t codes,
                   size_t scales, float *h_val, float *h_res, unsigned char *h_codes, float *h_dec, double *h_part)
{
    const cudaStream_t s = cc->stream;
    const size_t f = sizeof(float) * n;
    CHECK_CUDA(cudaMemcpyAsync(cc->d_val, h_val, f, cudaMemcpyHostToDevice, s));
    if (feedback) CHECK_CUDA(cudaMemcpyAsync(cc->d_res, h_res, f, cudaMemcpyHostToDevice, s));
    add_residual<<<grid_for(n), THREADS, 0, s>>>(cc->d_val, feedback ? cc->d_res : NULL, n);
    switch (c) {
    case CODEC_TOPK: return isth_fail(ISTH_ERUNTIME, "cuda codec: topk is encoded on the host");
    case CODEC_NONE: break; /* the codes are the values */
    case CODEC_BF16: CHECK(cuda_to_bf16((uint16_t *)cc->d_codes, cc->d_val, n, s)); break; /* layers.h's rounding */
    case CODEC_INT8:
    case CODEC_FP4: {
        const unsigned g = (unsigned)(blocks < 65535 ? blocks : 65535);
        block_scales<<<g, THREADS, 0, s>>>(cc->d_scale, cc->d_val, n, block,
                                           c == CODEC_INT8 ? CODEC_INT8_MAX : CODEC_FP4_MAX);
        if (c == CODEC_INT8)
            encode_int8<<<grid_for(n), THREADS, 0, s>>>((int8_t *)cc->d_codes, cc->d_val, cc->d_scale, n, block);
        else
            encode_fp4<<<grid_for((n + 1) / 2), THREADS, 0, s>>>(cc->d_codes, cc->d_val, cc->d_scale, n, block);
        break;
    }
    }
    decode_finish<<<CUDA_CODEC_PARTS, THREADS, 0, s>>>(cc->d_dec, feedback ? cc->d_res : NULL, cc->d_val,
                                                        cc->d_codes, cc->d_scale, n, block, c, cc->d_part);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpyAsync(h_codes, c == CODEC_NONE ? (const void *)cc->d_val : (const void *)cc->d_codes,
                               codes, cudaMemcpyDeviceToHost, s));
    if (scales) CHECK_CUDA(cudaMemcpyAsync(h_codes + codes, cc->d_scale, scales, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(h_dec, cc->d_dec, f, cudaMemcpyDeviceToHost, s));
    if (feedback) CHECK_CUDA(cudaMemcpyAsync(h_res, cc->d_res, f, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(h_part, cc->d_part, sizeof(double) * 2 * CUDA_CODEC_PARTS, cudaMemcpyDeviceToHost, s));
    return ISTH_OK;
}

extern "C" int cuda_codec_encode_ef(CudaCodec *cc, Codec c, const float *x, float *residual, size_t n, int block,
                                    unsigned char *out, float *decoded, double *err2, double *norm2)
{
    *err2 = *norm2 = 0.0;
    if (n == 0) return ISTH_OK;
    if (block < 1) return isth_fail(ISTH_ERUNTIME, "cuda codec: block %d < 1", block);
    if (c == CODEC_TOPK) return isth_fail(ISTH_ERUNTIME, "cuda codec: topk is encoded on the host (payload.c)");
    CHECK(reserve(cc, n));
    const cudaStream_t s = cc->stream;
    const size_t f = sizeof(float) * n;
    const size_t blocks = (n + (size_t)block - 1) / (size_t)block;
    const size_t codes = c == CODEC_NONE ? 4 * n : c == CODEC_BF16 ? 2 * n : c == CODEC_INT8 ? n : (n + 1) / 2;
    const size_t scales = (c == CODEC_INT8 || c == CODEC_FP4) ? 4 * blocks : 0;
    unsigned char *h = cc->h_stage;
    float *h_val = (float *)h, *h_res = (float *)(h + f);
    unsigned char *h_codes = h + 2 * f;           /* codes then scales: the wire layout, at most 4n + 4n bytes */
    float *h_dec = (float *)(h + 4 * f);
    double *h_part = (double *)(h + part_offset(n)); /* 5f, aligned for doubles */

    memcpy(h_val, x, f);
    if (residual) memcpy(h_res, residual, f);
    /* everything queued on the codec's stream, then one synchronisation,
     * also after a failure: no copy may still write the staging we return from */
    const int rc = enqueue(cc, c, residual != NULL, n, block, blocks, codes, scales, h_val, h_res, h_codes, h_dec,
                           h_part);
    const cudaError_t done = cudaStreamSynchronize(s);
    CHECK(rc);
    CHECK_CUDA(done);
    memcpy(out, h_codes, codes + scales);
    memcpy(decoded, h_dec, f);
    if (residual) memcpy(residual, h_res, f);
    for (int p = 0; p < CUDA_CODEC_PARTS; p++) {
        *err2 += h_part[2 * p];
        *norm2 += h_part[2 * p + 1];
    }
    return ISTH_OK;
}
