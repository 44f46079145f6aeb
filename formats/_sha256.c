/* SHA-256 of several messages at once on the CPU's SHA extensions (SHA-NI).
 *
 * WTXT hashes the same bytes several times: each 32 KiB chunk, the whole array, and with a
 * key the HMAC's inner hash over salt || array. One SHA-256 stream keeps the SHA unit of this
 * machine's cores half idle (each round waits for the one before), so the messages' rounds are
 * interleaved here, one block of each in turn: two streams hash at 1.46x, three at 1.68x the
 * bytes per second of one (64 MiB, in the cache: 1,960 MB/s for one stream, 2,870 for two,
 * 3,290 for three). OpenSSL, behind hashlib, hashes one message at a time.
 *
 * sha256_feed(data, chunk_len, contexts, out) hashes each chunk of data (a message that
 * starts and ends with the chunk: its digest goes to out; none for chunk_len 0) and adds data
 * to each running context. A context is this module's own 112-byte state (sha256_context makes one, after a
 * prefix such as the HMAC's key block and salt; sha256_finish pads a copy and gives the
 * digest). The GIL is released while the bytes are hashed. Only for CPUs with SHA-NI and
 * SSE4.1 (available()); callers fall back to hashlib elsewhere. Checked against hashlib and
 * hmac in tests/formats/test_sha256_lanes.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_SHA_TARGET 1
#endif

#define MAX_CONTEXTS 3
#define MAX_LANES (MAX_CONTEXTS + 1)

typedef struct {
    uint32_t state[8];
    uint64_t length;            /* bytes added so far, prefix included */
    uint32_t pending;           /* bytes waiting in block, < 64 */
    uint32_t magic;             /* CONTEXT_MAGIC: a buffer of the right size is not enough */
    unsigned char block[64];
} context;

#define CONTEXT_MAGIC 0x53484132u

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#ifdef HAVE_SHA_TARGET
static const uint32_t K[64] __attribute__((aligned(16))) = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

/* `blocks` 64-byte blocks of each of N messages (lane s: state[s], from p[s]), their rounds
 * interleaved. The schedule is Intel's SHA-NI sequence (four rounds per 128-bit step, the
 * message words kept in four registers); the loops over lanes are unrolled by the compiler,
 * N being a constant in each instance. */
#define DEFINE_COMPRESS(N)                                                                   \
__attribute__((target("sha,ssse3,sse4.1")))                                                  \
static void compress##N(uint32_t *const state[], const unsigned char *const p[],             \
                        size_t blocks)                                                       \
{                                                                                            \
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);      \
    __m128i abef[N], cdgh[N];                                                                \
    for (int s = 0; s < N; s++) {                                                            \
        __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)state[s]), 0xB1); \
        __m128i hgfe = _mm_shuffle_epi32(                                                    \
            _mm_loadu_si128((const __m128i *)(state[s] + 4)), 0x1B);                       \
        abef[s] = _mm_alignr_epi8(dcba, hgfe, 8);                                            \
        cdgh[s] = _mm_blend_epi16(hgfe, dcba, 0xF0);                                         \
    }                                                                                        \
    for (size_t b = 0; b < blocks; b++) {                                                    \
        __m128i saved0[N], saved1[N], m[N][4];                                               \
        for (int s = 0; s < N; s++) {                                                        \
            saved0[s] = abef[s];                                                             \
            saved1[s] = cdgh[s];                                                             \
            for (int i = 0; i < 4; i++)                                                      \
                m[s][i] = _mm_shuffle_epi8(                                                  \
                    _mm_loadu_si128((const __m128i *)(p[s] + 64 * b + 16 * i)), swap);     \
        }                                                                                    \
        _Pragma("GCC unroll 16")                                                             \
        for (int r = 0; r < 16; r++) {                                                       \
            const __m128i k = _mm_load_si128((const __m128i *)&K[4 * r]);                    \
            for (int s = 0; s < N; s++) {                                                    \
                __m128i w = _mm_add_epi32(m[s][r & 3], k);                                   \
                cdgh[s] = _mm_sha256rnds2_epu32(cdgh[s], abef[s], w);                        \
                if (r >= 3 && r <= 14) {                                                     \
                    __m128i t = _mm_alignr_epi8(m[s][r & 3], m[s][(r + 3) & 3], 4);          \
                    m[s][(r + 1) & 3] = _mm_sha256msg2_epu32(                                \
                        _mm_add_epi32(m[s][(r + 1) & 3], t), m[s][r & 3]);                   \
                }                                                                            \
                abef[s] = _mm_sha256rnds2_epu32(abef[s], cdgh[s], _mm_shuffle_epi32(w, 0x0E)); \
                if (r >= 1 && r <= 12)                                                       \
                    m[s][(r + 3) & 3] = _mm_sha256msg1_epu32(m[s][(r + 3) & 3], m[s][r & 3]); \
            }                                                                                \
        }                                                                                    \
        for (int s = 0; s < N; s++) {                                                        \
            abef[s] = _mm_add_epi32(abef[s], saved0[s]);                                     \
            cdgh[s] = _mm_add_epi32(cdgh[s], saved1[s]);                                     \
        }                                                                                    \
    }                                                                                        \
    for (int s = 0; s < N; s++) {                                                            \
        __m128i feba = _mm_shuffle_epi32(abef[s], 0x1B), dchg = _mm_shuffle_epi32(cdgh[s], 0xB1); \
        _mm_storeu_si128((__m128i *)state[s], _mm_blend_epi16(feba, dchg, 0xF0));            \
        _mm_storeu_si128((__m128i *)(state[s] + 4), _mm_alignr_epi8(dchg, feba, 8));        \
    }                                                                                        \
}

DEFINE_COMPRESS(1)
DEFINE_COMPRESS(2)
DEFINE_COMPRESS(3)
DEFINE_COMPRESS(4)

typedef struct {
    uint32_t *state;
    const unsigned char *at;
    size_t blocks;
} lane;

/* Every lane's blocks, as many lanes interleaved as still have blocks left. */
static void run_lanes(lane *lanes, int n)
{
    for (;;) {
        uint32_t *states[MAX_LANES];
        const unsigned char *at[MAX_LANES];
        size_t fewest = SIZE_MAX;
        int active = 0;
        for (int i = 0; i < n; i++)
            if (lanes[i].blocks) {
                states[active] = lanes[i].state;
                at[active++] = lanes[i].at;
                if (lanes[i].blocks < fewest)
                    fewest = lanes[i].blocks;
            }
        switch (active) {
        case 0: return;
        case 1: compress1(states, at, fewest); break;
        case 2: compress2(states, at, fewest); break;
        case 3: compress3(states, at, fewest); break;
        default: compress4(states, at, fewest); break;
        }
        for (int i = 0; i < n; i++)
            if (lanes[i].blocks) {
                lanes[i].blocks -= fewest;
                lanes[i].at += 64 * fewest;
            }
    }
}

static void compress_one(uint32_t *state, const unsigned char *block)
{
    uint32_t *states[1] = {state};
    const unsigned char *at[1] = {block};
    compress1(states, at, 1);
}

/* Add n bytes to a context (its partial block, then whole blocks, then the rest). */
static void absorb(context *c, const unsigned char *data, size_t n)
{
    c->length += n;
    if (c->pending) {
        size_t take = 64 - c->pending < n ? 64 - c->pending : n;
        memcpy(c->block + c->pending, data, take);
        c->pending += (uint32_t)take;
        data += take;
        n -= take;
        if (c->pending < 64)
            return;
        compress_one(c->state, c->block);
        c->pending = 0;
    }
    if (n >= 64) {
        lane one = {c->state, data, n / 64};
        run_lanes(&one, 1);
        data += n / 64 * 64;
        n %= 64;
    }
    memcpy(c->block, data, n);
    c->pending = (uint32_t)n;
}

/* The digest of a message whose whole blocks are in state, its last `rest` (< 64) bytes at
 * tail and `length` bytes long in all. */
static void finish(const uint32_t state_in[8], const unsigned char *tail, size_t rest,
                   uint64_t length, unsigned char out[32])
{
    uint32_t state[8];
    unsigned char last[128] = {0};
    memcpy(state, state_in, sizeof state);
    memcpy(last, tail, rest);
    last[rest] = 0x80;
    size_t blocks = rest < 56 ? 1 : 2;
    uint64_t bits = length * 8;
    for (int i = 0; i < 8; i++)
        last[64 * blocks - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t b = 0; b < blocks; b++)
        compress_one(state, last + 64 * b);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(state[i] >> 8);
        out[4 * i + 3] = (unsigned char)state[i];
    }
}

/* Chunk k of data to out[32k:], data added to each context: each chunk's whole blocks
 * interleaved with as many of each context's blocks. */
static void feed(const unsigned char *data, size_t n, size_t chunk_len, context **contexts,
                 int count, unsigned char *out)
{
    lane lanes[MAX_LANES];
    const unsigned char *next[MAX_CONTEXTS];      /* each context's first byte not absorbed */
    size_t rest[MAX_CONTEXTS];
    for (int c = 0; c < count; c++) {
        size_t top = contexts[c]->pending ? 64 - contexts[c]->pending : 0;
        if (top > n)
            top = n;
        absorb(contexts[c], data, top);     /* completes its partial block, if it can */
        contexts[c]->length += n - top;     /* the rest is counted now, absorbed below */
        next[c] = data + top;
        rest[c] = n - top;
    }
    size_t chunks = chunk_len == 0 ? 0 : n ? (n + chunk_len - 1) / chunk_len : 1;
    for (size_t k = 0; k < chunks; k++) {
        size_t start = k * chunk_len, len = n - start < chunk_len ? n - start : chunk_len;
        uint32_t state[8];
        memcpy(state, H0, sizeof state);
        lanes[0] = (lane){state, data + start, len / 64};
        for (int c = 0; c < count; c++) {
            size_t take = rest[c] / 64 < len / 64 ? rest[c] / 64 : len / 64;
            lanes[c + 1] = (lane){contexts[c]->state, next[c], take};
            next[c] += 64 * take;
            rest[c] -= 64 * take;
        }
        run_lanes(lanes, count + 1);
        finish(state, data + start + len / 64 * 64, len % 64, len, out + 32 * k);
    }
    for (int c = 0; c < count; c++) {      /* what the chunks' blocks left over */
        lanes[c] = (lane){contexts[c]->state, next[c], rest[c] / 64};
        next[c] += rest[c] / 64 * 64;
        rest[c] %= 64;
    }
    run_lanes(lanes, count);
    for (int c = 0; c < count; c++)
        if (rest[c]) {                      /* else its partial block, if any, is kept */
            memcpy(contexts[c]->block, next[c], rest[c]);
            contexts[c]->pending = (uint32_t)rest[c];
        }
}
#endif /* HAVE_SHA_TARGET */

static int cpu_has_sha(void)
{
#ifdef HAVE_SHA_TARGET
    __builtin_cpu_init();
    return __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1")
           && __builtin_cpu_supports("ssse3");
#else
    return 0;
#endif
}

static int has_sha;

static int need_sha(void)
{
    if (!has_sha)
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no SHA extensions: use hashlib");
    return has_sha;
}

/* A buffer (writable, if asked) holding exactly one context, or an exception set. */
static context *open_context(PyObject *obj, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    context *c = view->buf;
    if (view->len != (Py_ssize_t)sizeof(context) || c->magic != CONTEXT_MAGIC
        || c->pending >= 64) {
        PyErr_SetString(PyExc_ValueError, "not a sha256_context");
        PyBuffer_Release(view);
        return NULL;
    }
    return c;
}

static PyObject *sha256_context(PyObject *self, PyObject *args)
{
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "y*:sha256_context", &prefix))
        return NULL;
    if (!need_sha()) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    PyObject *result = PyByteArray_FromStringAndSize(NULL, sizeof(context));
    if (result != NULL) {
        context *c = (context *)PyByteArray_AS_STRING(result);
        memset(c, 0, sizeof *c);
        memcpy(c->state, H0, sizeof H0);
        c->magic = CONTEXT_MAGIC;
#ifdef HAVE_SHA_TARGET
        absorb(c, prefix.buf, (size_t)prefix.len);
#endif
    }
    PyBuffer_Release(&prefix);
    return result;
}

static PyObject *sha256_finish(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_buffer view;
    unsigned char digest[32];
    if (!PyArg_ParseTuple(args, "O:sha256_finish", &obj) || !need_sha())
        return NULL;
    context *c = open_context(obj, &view, 0);
    if (c == NULL)
        return NULL;
#ifdef HAVE_SHA_TARGET
    finish(c->state, c->block, c->pending, c->length, digest);
#endif
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)digest, 32);
}

static PyObject *sha256_feed(PyObject *self, PyObject *args)
{
    PyObject *contexts_obj, *out_obj;
    Py_buffer data, out, views[MAX_CONTEXTS];
    Py_ssize_t chunk_len;
    context *contexts[MAX_CONTEXTS];
    int opened = 0;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nOO:sha256_feed", &data, &chunk_len, &contexts_obj,
                          &out_obj))
        return NULL;
    if (!need_sha() || PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(contexts_obj, "contexts must be a sequence");
    if (seq == NULL)
        goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (chunk_len < 0 || count > MAX_CONTEXTS) {
        PyErr_Format(PyExc_ValueError, "expected chunk_len >= 0 and at most %d contexts",
                     MAX_CONTEXTS);
        goto done;
    }
    Py_ssize_t chunks = chunk_len == 0 ? 0 : data.len ? (data.len - 1) / chunk_len + 1 : 1;
    if (out.len != 32 * chunks) {
        PyErr_Format(PyExc_ValueError, "out: expected %zd bytes (32 per chunk), got %zd",
                     32 * chunks, out.len);
        goto done;
    }
    for (; opened < count; opened++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, opened);
        contexts[opened] = open_context(item, &views[opened], 1);
        if (contexts[opened] == NULL)
            goto done;
        for (int c = 0; c < opened; c++)
            if (contexts[c] == contexts[opened]) {
                PyErr_SetString(PyExc_ValueError, "the same context twice");
                PyBuffer_Release(&views[opened]);
                goto done;
            }
    }
#ifdef HAVE_SHA_TARGET
    Py_BEGIN_ALLOW_THREADS
    feed(data.buf, (size_t)data.len, (size_t)chunk_len, contexts, (int)count, out.buf);
    Py_END_ALLOW_THREADS
#endif
    result = Py_None;
    Py_INCREF(result);
done:
    for (int c = 0; c < opened; c++)
        PyBuffer_Release(&views[c]);
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return result;
}

static PyObject *available(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(has_sha);
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS,
     "available() -> bool: whether this CPU has the SHA extensions the other functions need."},
    {"sha256_context", sha256_context, METH_VARARGS,
     "sha256_context(prefix) -> bytearray: a running SHA-256 that has hashed prefix."},
    {"sha256_feed", sha256_feed, METH_VARARGS,
     "sha256_feed(data, chunk_len, contexts, out): the SHA-256 of each chunk_len-byte chunk\n"
     "of data (the last may be shorter; empty data is one empty chunk; no chunks for\n"
     "chunk_len 0) into out (32 bytes per chunk), and data added to each of up to 3\n"
     "contexts, all in one pass."},
    {"sha256_finish", sha256_finish, METH_VARARGS,
     "sha256_finish(context) -> bytes: the digest of what the context has hashed (the\n"
     "context itself is left as it was)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sha256",
    "SHA-256 of a buffer's chunks and of running messages in one interleaved pass (SHA-NI);\n"
    "see formats/sha256lanes.py.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sha256(void)
{
    has_sha = cpu_has_sha();
    return PyModule_Create(&module);
}
