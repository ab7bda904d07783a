/* codec.h (cuda/) — inter-site payloads encoded on the GPU: src/codec.h's
 * codec_encode_ef with its arithmetic in kernels (src/codec_math.h, shared
 * with the host), so the bytes on the wire, the decoded values and the
 * error-feedback residual are the host's, bit for bit.
 *
 * Owns: the device buffers and pinned host staging of one encoding, and the
 * stream it runs on (given: the backend's copy stream, not the compute
 * stream, so an encoding overlaps the inner steps queued there).
 * Must not: know about fragments, peers or the link; keep payloads between
 * calls (payload.c frames them; the shard owns the residuals, on the host).
 */
#ifndef ISTHMUS_CUDA_CODEC_H
#define ISTHMUS_CUDA_CODEC_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../src/codec.h" /* this header shares its name */

typedef struct {
    cudaStream_t stream;           /* where the encoding runs (not owned) */
    size_t cap;                    /* values the buffers hold */
    float *d_val, *d_res, *d_dec;  /* (cap, device) x + residual, residual, decoded */
    float *d_scale;                /* (cap, device) one per codec block, at most one per value */
    unsigned char *d_codes;        /* (4 cap, device) the codes */
    double *d_part;                /* (2 * CUDA_CODEC_PARTS, device) per-block err2, norm2 */
    unsigned char *h_stage;        /* pinned host: values in, then everything out */
    size_t h_cap;                  /* bytes of h_stage */
} CudaCodec;

/* Thread blocks whose partial sums make err2 and norm2 (a fixed count, so
 * the sums are deterministic). */
#define CUDA_CODEC_PARTS 256

void cuda_codec_init(CudaCodec *cc, cudaStream_t stream);
void cuda_codec_destroy(CudaCodec *cc);

/* codec_encode_ef (src/codec.h) on the GPU; host pointers in and out, the
 * same contract: out the encoding, decoded what receivers reconstruct,
 * residual (NULL: no feedback) updated in place. err2 and norm2 are summed
 * in a fixed order (deterministic; equal to the host's to double rounding). */
int cuda_codec_encode_ef(CudaCodec *cc, Codec c, const float *x, float *residual, size_t n, int block,
                         unsigned char *out, float *decoded, double *err2, double *norm2);

#ifdef __cplusplus
}
#endif

#endif
