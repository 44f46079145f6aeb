/* The byte kernels numpy needs several passes for, each done in one pass here:
 *
 * - WTXT base64 lines: "<width characters> <parity hex digit>\n", built (put_lines) and taken
 *   apart and checked (gather_lines) line by line. numpy needed four passes (copy, XOR
 *   reduction, hex lookup, separator checks); a 256 MiB keyed verify spent a fifth of its CPU
 *   there.
 *   decode_lines also decodes the full lines, a block of them at a time, with libbase64.
 * - Residuals of the LFS store: byte planes unshuffled and XORed into the items of the base
 *   (unshuffle_xor) in one sequential pass, where numpy made one strided pass per plane, the
 *   sparse ones expanded on the way from a bitmap and their nonzero bytes; sparse planes
 *   expanded on their own (expand_nonzero), where numpy's masked assignment ran 30-40 times
 *   slower.
 * - The same residuals compressed: a zstd sequence producer (zero_run_sequences) that parses a
 *   block as literals except for its long runs of zeros; zstd's match finders cut the carry
 *   planes into many short matches that decode twice as slowly as Huffman-coded literals.
 * - Loose git objects stored without compression: the deflate "stored" blocks of a window
 *   checked and their contents joined at its front (join_stored_blocks), where a Python loop
 *   held the GIL for every 32 KiB block of a restore's shards.
 *
 * Every function takes buffers through the buffer protocol and checks their shapes against
 * each other before touching a byte; nothing is read or written outside what the exporter
 * (numpy) says the buffer holds. The GIL is released while the bytes are worked on, so the
 * codecs' threads run on both cores.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <tmmintrin.h>
#define HAVE_SSSE3_TARGET 1
#endif

static const char HEX[16] = "0123456789abcdef";

/* XOR of the line's characters, low four bits (the format's parity nibble). */
static inline unsigned parity(const unsigned char *p, Py_ssize_t width)
{
    uint64_t acc = 0;
    Py_ssize_t k = 0;
    for (; k + 8 <= width; k += 8) {
        uint64_t word;
        memcpy(&word, p + k, 8);
        acc ^= word;
    }
    for (; k < width; k++)
        acc ^= p[k];
    acc ^= acc >> 32;
    acc ^= acc >> 16;
    acc ^= acc >> 8;
    return (unsigned)(acc & 0xF);
}

/* Whether the line's characters are followed by a space, their parity digit and LF. */
static inline int line_ends_well(const unsigned char *line, Py_ssize_t width)
{
    return line[width] == ' ' && line[width + 2] == '\n'
           && line[width + 1] == (unsigned char)HEX[parity(line, width)];
}

/* The full lines of a chunk are all 76 characters wide: with the width a constant, the
 * compiler inlines the copy and unrolls the XOR (1.5-1.7x faster than the general loop). */
#define FULL_WIDTH 76

/* A (count, n, k) uint8 view with a contiguous last axis, or an exception set. */
static int get_view(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0)
        return -1;
    if (view->ndim != 3 || view->itemsize != 1
        || (view->format != NULL && strcmp(view->format, "B") != 0)
        || (view->shape[2] > 1 && view->strides[2] != 1)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a 3-d uint8 buffer with a contiguous last axis", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Views of lines (count, n, width + 3) and chars (count, n, width), the one to be written
 * writable; 0, or -1 with an exception set and nothing held. */
static int open_pair(PyObject *lines_obj, PyObject *chars_obj, int write_lines,
                     Py_buffer *lines, Py_buffer *chars)
{
    if (get_view(lines_obj, lines, write_lines, "lines") < 0)
        return -1;
    if (get_view(chars_obj, chars, !write_lines, "chars") < 0) {
        PyBuffer_Release(lines);
        return -1;
    }
    if (lines->shape[0] != chars->shape[0] || lines->shape[1] != chars->shape[1]
        || lines->shape[2] != chars->shape[2] + 3) {
        PyErr_SetString(PyExc_ValueError,
                        "lines must be (count, n, width + 3) for chars of (count, n, width)");
        PyBuffer_Release(lines);
        PyBuffer_Release(chars);
        return -1;
    }
    return 0;
}

static PyObject *put_lines(PyObject *self, PyObject *args)
{
    PyObject *lines_obj, *chars_obj;
    Py_buffer lines, chars;
    if (!PyArg_ParseTuple(args, "OO:put_lines", &lines_obj, &chars_obj)
        || open_pair(lines_obj, chars_obj, 1, &lines, &chars) < 0)
        return NULL;
    Py_ssize_t width = chars.shape[2];
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < chars.shape[0]; i++) {
        for (Py_ssize_t j = 0; j < chars.shape[1]; j++) {
            const unsigned char *src = (const unsigned char *)chars.buf
                                       + i * chars.strides[0] + j * chars.strides[1];
            unsigned char *dst = (unsigned char *)lines.buf
                                 + i * lines.strides[0] + j * lines.strides[1];
            unsigned p;
            if (width == FULL_WIDTH) {
                memcpy(dst, src, FULL_WIDTH);
                p = parity(src, FULL_WIDTH);
            } else {
                memcpy(dst, src, (size_t)width);
                p = parity(src, width);
            }
            dst[width] = ' ';
            dst[width + 1] = (unsigned char)HEX[p];
            dst[width + 2] = '\n';
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lines);
    PyBuffer_Release(&chars);
    Py_RETURN_NONE;
}

static PyObject *gather_lines(PyObject *self, PyObject *args)
{
    PyObject *lines_obj, *chars_obj;
    int check;
    Py_buffer lines, chars;
    if (!PyArg_ParseTuple(args, "OOp:gather_lines", &lines_obj, &chars_obj, &check)
        || open_pair(lines_obj, chars_obj, 0, &lines, &chars) < 0)
        return NULL;
    Py_ssize_t width = chars.shape[2];
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; ok && i < chars.shape[0]; i++) {
        for (Py_ssize_t j = 0; j < chars.shape[1]; j++) {
            const unsigned char *src = (const unsigned char *)lines.buf
                                       + i * lines.strides[0] + j * lines.strides[1];
            unsigned char *dst = (unsigned char *)chars.buf
                                 + i * chars.strides[0] + j * chars.strides[1];
            if (width == FULL_WIDTH)
                memcpy(dst, src, FULL_WIDTH);
            else
                memcpy(dst, src, (size_t)width);
            if (check && !(width == FULL_WIDTH ? line_ends_well(src, FULL_WIDTH)
                                               : line_ends_well(src, width))) {
                ok = 0;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lines);
    PyBuffer_Release(&chars);
    return PyBool_FromLong(ok);
}

/* libbase64's one-shot decoder, as pybase64's extension exports it (its address is handed
 * over once by set_base64_decoder; see wtxt/_lines.py). Decoding the gathered characters of a
 * few hundred lines while they are still in the cache, straight into the array, saves writing
 * them out, reading them back and copying the decoded bytes once more. Called with flags 0,
 * libbase64 uses the codec it chose for this CPU, kept in a global that pybase64's own calls
 * may set again meanwhile: one aligned pointer per direction, and every codec decodes alike. */
typedef int (*base64_decode_fn)(const char *src, size_t srclen, char *out, size_t *outlen,
                                int flags);
static base64_decode_fn base64_decoder = NULL;

static PyObject *set_base64_decoder(PyObject *self, PyObject *args)
{
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K:set_base64_decoder", &address))
        return NULL;
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "the decoder's address is NULL");
        return NULL;
    }
    base64_decoder = (base64_decode_fn)(uintptr_t)address;
    Py_RETURN_NONE;
}

#define RAW_PER_FULL_LINE 57
#define DECODE_BLOCK_LINES 256   /* 19 KiB of characters: decoded while in the L1 cache */

static PyObject *decode_lines(PyObject *self, PyObject *args)
{
    PyObject *lines_obj, *dest_obj;
    int check;
    Py_buffer lines, dest;
    if (!PyArg_ParseTuple(args, "OOp:decode_lines", &lines_obj, &dest_obj, &check))
        return NULL;
    if (base64_decoder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no base64 decoder: call set_base64_decoder first");
        return NULL;
    }
    if (get_view(lines_obj, &lines, 0, "lines") < 0)
        return NULL;
    if (get_view(dest_obj, &dest, 1, "dest") < 0) {
        PyBuffer_Release(&lines);
        return NULL;
    }
    if (lines.shape[2] != FULL_WIDTH + 3 || dest.shape[2] != RAW_PER_FULL_LINE
        || lines.shape[0] != dest.shape[0] || lines.shape[1] != dest.shape[1]
        || (dest.shape[1] > 1 && dest.strides[1] != RAW_PER_FULL_LINE)) {
        PyErr_SetString(PyExc_ValueError,
                        "lines must be (count, n, 79) and dest (count, n, 57) with each "
                        "chunk's n * 57 bytes contiguous");
        PyBuffer_Release(&lines);
        PyBuffer_Release(&dest);
        return NULL;
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    unsigned char chars[DECODE_BLOCK_LINES * FULL_WIDTH];
    for (Py_ssize_t i = 0; ok && i < lines.shape[0]; i++) {
        for (Py_ssize_t j0 = 0; ok && j0 < lines.shape[1]; j0 += DECODE_BLOCK_LINES) {
            Py_ssize_t m = lines.shape[1] - j0 < DECODE_BLOCK_LINES ? lines.shape[1] - j0
                                                                     : DECODE_BLOCK_LINES;
            for (Py_ssize_t j = 0; j < m; j++) {
                const unsigned char *src = (const unsigned char *)lines.buf
                                           + i * lines.strides[0] + (j0 + j) * lines.strides[1];
                memcpy(chars + j * FULL_WIDTH, src, FULL_WIDTH);
                if (check && !line_ends_well(src, FULL_WIDTH)) {
                    ok = 0;
                    break;
                }
            }
            if (!ok)
                break;
            char *out = (char *)dest.buf + i * dest.strides[0] + j0 * RAW_PER_FULL_LINE;
            size_t got = 0;
            if (base64_decoder((const char *)chars, (size_t)m * FULL_WIDTH, out, &got, 0) != 1
                || got != (size_t)m * RAW_PER_FULL_LINE)
                ok = 0;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lines);
    PyBuffer_Release(&dest);
    return PyBool_FromLong(ok);
}

/* A sparse byte plane of a residual (docs/formats/residual.md): a bitmap of its nonzero
 * bytes (bit j of byte g, least significant first, for byte 8g + j) and those bytes in
 * order, expanded into the plane. Eight bytes at a time: the bitmap byte picks a shuffle
 * that moves the next popcount values into place and zeros the rest (SSSE3 where the CPU has
 * it, else one byte at a time). */
static uint8_t SPREAD[256][8], GATHER[256][8], BITS[256];   /* BITS: no popcnt assumed */

static void build_spread(void)
{
    for (int m = 0; m < 256; m++) {
        int k = 0;
        memset(GATHER[m], 0x80, 8);
        for (int j = 0; j < 8; j++) {
            if (m >> j & 1)
                GATHER[m][k] = (uint8_t)j;
            SPREAD[m][j] = (m >> j & 1) ? (uint8_t)k++ : 0x80;
        }
        BITS[m] = (uint8_t)k;
    }
}

/* From byte 8g of the plane and value k on; the number of values used, or -1 when the bitmap
 * asks for more values than there are. */
static Py_ssize_t expand_scalar(unsigned char *out, Py_ssize_t n, const unsigned char *bitmap,
                                const unsigned char *values, Py_ssize_t nvalues, Py_ssize_t g,
                                Py_ssize_t k)
{
    for (Py_ssize_t i = 8 * g; i < n; i++) {
        unsigned bit = bitmap[i >> 3] >> (i & 7) & 1;
        if (bit && k == nvalues)
            return -1;
        out[i] = bit ? values[k] : 0;
        k += bit;
    }
    return k;
}

#ifdef HAVE_SSSE3_TARGET
__attribute__((target("ssse3")))
static Py_ssize_t expand_ssse3(unsigned char *out, Py_ssize_t n, const unsigned char *bitmap,
                               const unsigned char *values, Py_ssize_t nvalues,
                               Py_ssize_t *group)
{
    Py_ssize_t g = 0, k = 0;
    for (; 8 * g + 16 <= n && k + 16 <= nvalues; g += 2) {  /* never reads past the values */
        unsigned m0 = bitmap[g], m1 = bitmap[g + 1];
        __m128i lo = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(values + k)),
                                      _mm_loadl_epi64((const __m128i *)SPREAD[m0]));
        k += BITS[m0];
        __m128i hi = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(values + k)),
                                      _mm_loadl_epi64((const __m128i *)SPREAD[m1]));
        k += BITS[m1];
        _mm_storeu_si128((__m128i *)(out + 8 * g), _mm_unpacklo_epi64(lo, hi));
    }
    *group = g;
    return k;
}
#endif

/* The three buffers (contiguous; writable where flags say PyBUF_CONTIG) of a call taking
 * exactly three objects; 0, or -1 with an exception set and nothing held. */
static int three_buffers(PyObject *args, const char *name, Py_buffer bufs[3],
                         const int flags[3])
{
    PyObject *objs[3];
    if (!PyArg_UnpackTuple(args, name, 3, 3, &objs[0], &objs[1], &objs[2]))
        return -1;
    for (int i = 0; i < 3; i++) {
        if (PyObject_GetBuffer(objs[i], &bufs[i], flags[i]) < 0) {
            while (i--)
                PyBuffer_Release(&bufs[i]);
            return -1;
        }
    }
    return 0;
}

static void release_three(Py_buffer bufs[3])
{
    for (int i = 0; i < 3; i++)
        PyBuffer_Release(&bufs[i]);
}

/* The other way (the writer's): the bitmap and the nonzero bytes of a plane; the number of
 * values, all written below values + n and never ahead of the byte being read, so values may
 * be the plane itself (compacted in place). */
static Py_ssize_t compact_scalar(const unsigned char *plane, Py_ssize_t n,
                                 unsigned char *bitmap, unsigned char *values, Py_ssize_t g,
                                 Py_ssize_t k)
{
    for (Py_ssize_t i = 8 * g; i < n; i++) {
        if (!(i & 7))
            bitmap[i >> 3] = 0;
        unsigned bit = plane[i] != 0;
        bitmap[i >> 3] |= (unsigned char)(bit << (i & 7));
        values[k] = plane[i];
        k += bit;
    }
    return k;
}

#ifdef HAVE_SSSE3_TARGET
__attribute__((target("ssse3")))
static Py_ssize_t compact_ssse3(const unsigned char *plane, Py_ssize_t n,
                                unsigned char *bitmap, unsigned char *values,
                                Py_ssize_t *group)
{
    Py_ssize_t g = 0, k = 0;
    const __m128i zero = _mm_setzero_si128();
    for (; 8 * g + 16 <= n; g += 2) {     /* k + 8 <= 8g + 16 <= n: stores stay below n */
        __m128i v = _mm_loadu_si128((const __m128i *)(plane + 8 * g));
        unsigned m = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) & 0xFFFF;
        unsigned lo = m & 0xFF, hi = m >> 8;
        bitmap[g] = (unsigned char)lo;
        bitmap[g + 1] = (unsigned char)hi;
        _mm_storel_epi64((__m128i *)(values + k),
                         _mm_shuffle_epi8(v, _mm_loadl_epi64((const __m128i *)GATHER[lo])));
        k += BITS[lo];
        _mm_storel_epi64((__m128i *)(values + k),
                         _mm_shuffle_epi8(_mm_srli_si128(v, 8),
                                          _mm_loadl_epi64((const __m128i *)GATHER[hi])));
        k += BITS[hi];
    }
    *group = g;
    return k;
}
#endif

static PyObject *compact_nonzero(PyObject *self, PyObject *args)
{
    Py_buffer bufs[3];
    if (three_buffers(args, "compact_nonzero", bufs,
                      (const int[3]){PyBUF_CONTIG_RO, PyBUF_CONTIG, PyBUF_CONTIG}) < 0)
        return NULL;
    Py_buffer plane = bufs[0], bitmap = bufs[1], values = bufs[2];
    Py_ssize_t n = plane.len, g = 0, k = -1;
    if (bitmap.len == (n + 7) / 8 && values.len >= n) {
        k = 0;
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_SSSE3_TARGET
        if (__builtin_cpu_supports("ssse3"))
            k = compact_ssse3(plane.buf, n, bitmap.buf, values.buf, &g);
#endif
        k = compact_scalar(plane.buf, n, bitmap.buf, values.buf, g, k);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_Format(PyExc_ValueError, "a plane of %zd bytes needs a bitmap of %zd bytes and "
                     "room for %zd values: got %zd and %zd", n, (n + 7) / 8, n, bitmap.len,
                     values.len);
    }
    release_three(bufs);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

static PyObject *expand_nonzero(PyObject *self, PyObject *args)
{
    Py_buffer bufs[3];
    if (three_buffers(args, "expand_nonzero", bufs,
                      (const int[3]){PyBUF_CONTIG, PyBUF_CONTIG_RO, PyBUF_CONTIG_RO}) < 0)
        return NULL;
    Py_buffer out = bufs[0], bitmap = bufs[1], values = bufs[2];
    const unsigned char *bits = bitmap.buf;
    Py_ssize_t n = out.len, g = 0, k = 0;
    int fits = bitmap.len == (n + 7) / 8 && !(n % 8 && bits[n / 8] >> (n % 8));
    if (fits) {
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_SSSE3_TARGET
        if (__builtin_cpu_supports("ssse3"))
            k = expand_ssse3(out.buf, n, bits, values.buf, values.len, &g);
#endif
        k = expand_scalar(out.buf, n, bits, values.buf, values.len, g, k);
        Py_END_ALLOW_THREADS
    }
    int bad = !fits || k != values.len;   /* a bit past the plane's end, or values left over */
    if (bad)
        PyErr_Format(PyExc_ValueError, "the bitmap (%zd bytes) does not describe %zd values "
                     "in %zd bytes", bitmap.len, values.len, n);
    release_three(bufs);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

/* Residual planes applied: items[i * size + k] ^= byte i of plane k, for n items of size
 * bytes, in one sequential pass over the items. A plane is dense (its n bytes) or sparse (a
 * bitmap of its nonzero bytes and those bytes, expanded 16 at a time on the way, as
 * expand_nonzero does). Why on the way: expanded beforehand, the planes of a sparse change
 * (1% of rows) cost a write and a read of a shard's worth of zeros per residual of a chain;
 * applied in passes of their own, walking each bitmap's set bits, they cost a second pass
 * over the items and a few ns per bit: against expanding beforehand, chains of 64 MiB of
 * dense f32 and bf16 residuals restored 17% and 41% slower, and the gen-128 chain of a
 * sparse change (its first residuals change a quarter of the items) 55% slower; on the way,
 * 6%, 5% and 29% faster (7 residuals of 1% of rows: 42% faster). Items whose planes hold
 * only zeros (64 at a time, then 16) are neither read nor written: a residual of a sparse
 * change leaves nearly all of the shard alone, and costs the read of its dense planes and
 * bitmaps there. */
typedef struct {
    const unsigned char *bytes;         /* a dense plane's n bytes; NULL: sparse */
    const unsigned char *bitmap;        /* a sparse plane's: bit i set, byte i is a value */
    const unsigned char *values;
    Py_ssize_t count, used;             /* values, and those used so far */
    int missing;                        /* a set bit found no value left */
} plane_source;

/* Bytes i..i+m of a sparse plane (i a multiple of 8) expanded into out, its values used in
 * order: 16 at a time with SSSE3 (which stops 16 values short of their end), then byte by
 * byte. A set bit without a value left marks the plane missing (out is then zeros). */
static void expand_range(plane_source *s, Py_ssize_t i, Py_ssize_t m, unsigned char *out,
                         int ssse3)
{
    const unsigned char *bits = s->bitmap + i / 8, *values = s->values + s->used;
    Py_ssize_t left = s->count - s->used, g = 0, k = 0;
#ifdef HAVE_SSSE3_TARGET
    if (ssse3)
        k = expand_ssse3(out, m, bits, values, left, &g);
#endif
    (void)ssse3;
    k = expand_scalar(out, m, bits, values, left, g, k);
    if (k < 0) {
        memset(out, 0, (size_t)m);
        s->missing = 1;
        k = left;
    }
    s->used += k;
}

/* Items from..n (from a multiple of 8) a chunk at a time, the chunk's sparse planes expanded
 * first on the stack, so that the byte loop runs as over dense planes (64 MiB of float64,
 * plane 0 sparse: 14 ms; 39 ms testing a bit per byte; 20 ms expanded beforehand): item
 * sizes other than 2 and 4, the items after the last whole block of 16, CPUs without
 * SSSE3. */
#define CHUNK_ITEMS 512
static void unshuffle_xor_chunks(unsigned char *items, plane_source *src, Py_ssize_t from,
                                 Py_ssize_t n, Py_ssize_t size, int ssse3)
{
    unsigned char expanded[8][CHUNK_ITEMS];
    const unsigned char *p[8];
    for (Py_ssize_t i = from; i < n; i += CHUNK_ITEMS) {
        Py_ssize_t m = n - i < CHUNK_ITEMS ? n - i : CHUNK_ITEMS;
        for (Py_ssize_t k = 0; k < size; k++) {
            p[k] = src[k].bytes ? src[k].bytes + i : expanded[k];
            if (!src[k].bytes)
                expand_range(&src[k], i, m, expanded[k], ssse3);
        }
        for (Py_ssize_t j = 0; j < m; j++)
            for (Py_ssize_t k = 0; k < size; k++)
                items[(i + j) * size + k] ^= p[k][j];
    }
}

#ifdef HAVE_SSSE3_TARGET
/* Bytes i..i+16 of a plane (i a multiple of 16: two bitmap bytes). Within 16 values of their
 * end, byte by byte: no load reaches past them. */
__attribute__((target("ssse3")))
static inline __m128i plane_block(plane_source *s, Py_ssize_t i)
{
    if (s->bytes)
        return _mm_loadu_si128((const __m128i *)(s->bytes + i));
    unsigned m0 = s->bitmap[i >> 3], m1 = s->bitmap[(i >> 3) + 1];
    if (!(m0 | m1))
        return _mm_setzero_si128();
    if (s->count - s->used < 16) {
        unsigned char block[16];
        expand_range(s, i, 16, block, 0);
        return _mm_loadu_si128((const __m128i *)block);
    }
    __m128i lo = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(s->values + s->used)),
                                  _mm_loadl_epi64((const __m128i *)SPREAD[m0]));
    s->used += BITS[m0];
    __m128i hi = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(s->values + s->used)),
                                  _mm_loadl_epi64((const __m128i *)SPREAD[m1]));
    s->used += BITS[m1];
    return _mm_unpacklo_epi64(lo, hi);
}

/* Items i..i+16 (i a multiple of 16) of item size 4 or 2: the planes' bytes interleaved in
 * two unpack steps (the compiler's own vectorization of the scalar loop widens and shifts:
 * 1.5x slower in the cache) and XORed in, unless they are all zero. */
__attribute__((target("ssse3"), always_inline))
static inline void xor_block(unsigned char *items, plane_source *src, Py_ssize_t size,
                             Py_ssize_t i)
{
    const __m128i zero = _mm_setzero_si128();
    if (size == 4) {
        __m128i a = plane_block(&src[0], i), b = plane_block(&src[1], i),
                c = plane_block(&src[2], i), d = plane_block(&src[3], i);
        __m128i any = _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(any, zero)) == 0xFFFF)
            return;
        __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b),
                cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
        __m128i w[4] = {_mm_unpacklo_epi16(ab_lo, cd_lo), _mm_unpackhi_epi16(ab_lo, cd_lo),
                        _mm_unpacklo_epi16(ab_hi, cd_hi), _mm_unpackhi_epi16(ab_hi, cd_hi)};
        for (int k = 0; k < 4; k++) {
            __m128i *at = (__m128i *)(items + 4 * i + 16 * k);
            _mm_storeu_si128(at, _mm_xor_si128(_mm_loadu_si128(at), w[k]));
        }
    } else {
        __m128i a = plane_block(&src[0], i), b = plane_block(&src[1], i);
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_or_si128(a, b), zero)) == 0xFFFF)
            return;
        __m128i w[2] = {_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b)};
        for (int k = 0; k < 2; k++) {
            __m128i *at = (__m128i *)(items + 2 * i + 16 * k);
            _mm_storeu_si128(at, _mm_xor_si128(_mm_loadu_si128(at), w[k]));
        }
    }
}

/* Whether items i..i+64 (i a multiple of 64) have only zeros in every plane: a dense plane's
 * 64 bytes, a sparse plane's 8 bitmap bytes. A sparse change's residual is all zeros but for
 * its changed rows, and is skipped 64 items at a time (a 1%-rows residual of 64 MiB of f32:
 * 2.2 ms applied 16 items at a time, 1.2 ms so). */
__attribute__((target("ssse3"), always_inline))
static inline int quiet(const plane_source *src, Py_ssize_t size, Py_ssize_t i)
{
    __m128i any = _mm_setzero_si128();
    uint64_t bits = 0;
    for (Py_ssize_t k = 0; k < size; k++) {
        if (src[k].bytes) {
            const unsigned char *bytes = src[k].bytes + i;
            for (int j = 0; j < 64; j += 16)
                any = _mm_or_si128(any, _mm_loadu_si128((const __m128i *)(bytes + j)));
        } else {
            uint64_t word;
            memcpy(&word, src[k].bitmap + i / 8, 8);
            bits |= word;
        }
    }
    return !bits && _mm_movemask_epi8(_mm_cmpeq_epi8(any, _mm_setzero_si128())) == 0xFFFF;
}

/* The whole blocks of 16 items of item size 4 or 2 (a constant once inlined); how many
 * items that was. */
__attribute__((target("ssse3"), always_inline))
static inline Py_ssize_t xor_blocks(unsigned char *items, plane_source *src, Py_ssize_t n,
                                    Py_ssize_t size)
{
    Py_ssize_t i = 0;
    for (; i + 64 <= n; i += 64)
        if (!quiet(src, size, i))
            for (Py_ssize_t j = i; j < i + 64; j += 16)
                xor_block(items, src, size, j);
    for (; i + 16 <= n; i += 16)
        xor_block(items, src, size, i);
    return i;
}

__attribute__((target("ssse3")))
static Py_ssize_t unshuffle_xor_ssse3(unsigned char *items, plane_source *planes,
                                      Py_ssize_t n, Py_ssize_t size)
{
    plane_source src[4];      /* a local copy: its counts stay in registers across the stores */
    memcpy(src, planes, (size_t)size * sizeof *src);
    Py_ssize_t done = size == 4 ? xor_blocks(items, src, n, 4) : xor_blocks(items, src, n, 2);
    memcpy(planes, src, (size_t)size * sizeof *src);
    return done;
}
#endif

static void unshuffle_xor_planes(unsigned char *items, plane_source *src, Py_ssize_t n,
                                 Py_ssize_t size)
{
    Py_ssize_t done = 0;
    int ssse3 = 0;
#ifdef HAVE_SSSE3_TARGET
    ssse3 = __builtin_cpu_supports("ssse3");
    if (ssse3 && (size == 2 || size == 4))
        done = unshuffle_xor_ssse3(items, src, n, size);
#endif
    unshuffle_xor_chunks(items, src, done, n, size, ssse3);
}

/* The sparse planes of an unshuffle_xor call, (plane, bitmap, values) each, into src (whose
 * dense planes are set already) and views (two per plane, *held of them held); 0, or -1
 * with an exception set. A bitmap must have a bit per item and none past the last. */
static int open_sparse(PyObject *sparse, plane_source src[8], Py_buffer views[16], int *held,
                       Py_ssize_t n, Py_ssize_t size)
{
    PyObject *seq = PySequence_Fast(sparse, "sparse must be a sequence of (plane, bitmap, "
                                    "values)");
    if (seq == NULL)
        return -1;
    int status = 0;
    for (Py_ssize_t s = 0; status == 0 && s < PySequence_Fast_GET_SIZE(seq); s++) {
        PyObject *bitmap_obj, *values_obj;
        Py_ssize_t k;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, s), "nOO;sparse must be a "
                              "sequence of (plane, bitmap, values)", &k, &bitmap_obj,
                              &values_obj)) {
            status = -1;
            break;
        }
        if (k < 0 || k >= size || src[k].bytes == NULL) {
            PyErr_Format(PyExc_ValueError, "sparse plane %zd: not a plane of %zd, or named "
                         "twice", k, size);
            status = -1;
            break;
        }
        Py_buffer *bitmap = &views[*held], *values = &views[*held + 1];
        if (PyObject_GetBuffer(bitmap_obj, bitmap, PyBUF_CONTIG_RO) < 0) {
            status = -1;
            break;
        }
        if (PyObject_GetBuffer(values_obj, values, PyBUF_CONTIG_RO) < 0) {
            PyBuffer_Release(bitmap);
            status = -1;
            break;
        }
        *held += 2;
        const unsigned char *bits = bitmap->buf;
        if (bitmap->len != (n + 7) / 8) {
            PyErr_Format(PyExc_ValueError, "sparse plane %zd: %zd items need a bitmap of %zd "
                         "bytes, got %zd", k, n, (n + 7) / 8, bitmap->len);
            status = -1;
            break;
        }
        if (n % 8 && bits[n / 8] >> (n % 8)) {
            PyErr_Format(PyExc_ValueError, "sparse plane %zd: the bitmap sets bits past its "
                         "%zd items", k, n);
            status = -1;
            break;
        }
        src[k] = (plane_source){NULL, bits, values->buf, values->len, 0, 0};
    }
    Py_DECREF(seq);
    return status;
}

static PyObject *unshuffle_xor(PyObject *self, PyObject *args)
{
    PyObject *items_obj, *planes_obj, *sparse = NULL;
    Py_ssize_t size;
    Py_buffer items, planes, views[16];
    int held = 0;
    if (!PyArg_ParseTuple(args, "OOn|O:unshuffle_xor", &items_obj, &planes_obj, &size,
                          &sparse))
        return NULL;
    if (size < 1 || size > 8) {
        PyErr_Format(PyExc_ValueError, "itemsize must be 1..8, got %zd", size);
        return NULL;
    }
    if (PyObject_GetBuffer(items_obj, &items, PyBUF_CONTIG) < 0)
        return NULL;
    if (PyObject_GetBuffer(planes_obj, &planes, PyBUF_CONTIG_RO) < 0) {
        PyBuffer_Release(&items);
        return NULL;
    }
    Py_ssize_t n = items.len / size;
    plane_source src[8];
    for (Py_ssize_t k = 0; k < size; k++)
        src[k] = (plane_source){(const unsigned char *)planes.buf + k * n, NULL, NULL, 0, 0, 0};
    int ok = 1;
    if (items.len != planes.len || items.len % size) {
        PyErr_Format(PyExc_ValueError, "items and planes must be the same whole number of "
                     "items: %zd and %zd bytes, itemsize %zd", items.len, planes.len, size);
        ok = 0;
    } else if (sparse != NULL && open_sparse(sparse, src, views, &held, n, size) < 0) {
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        unshuffle_xor_planes(items.buf, src, n, size);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t k = 0; ok && k < size; k++) {
            if (src[k].bytes == NULL && (src[k].missing || src[k].used != src[k].count)) {
                PyErr_Format(PyExc_ValueError, "sparse plane %zd: the bitmap does not set as "
                             "many bits as there are values (%zd)", k, src[k].count);
                ok = 0;
            }
        }
    }
    while (held--)
        PyBuffer_Release(&views[held]);
    PyBuffer_Release(&items);
    PyBuffer_Release(&planes);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* A zstd sequence producer (ZSTD_sequenceProducer_F of libzstd 1.5.x, registered with
 * ZSTD_registerSequenceProducer): the block is literals, which zstd Huffman-codes, except
 * that every run of at least ZERO_RUN zero bytes becomes matches. Every such run holds an
 * aligned 8-byte zero word, so the block is scanned a word at a time.
 *
 * The first run of a block is a literal zero, 15 zeros at offset 1 and the rest at offset
 * 16; each later one copies the longest run before it (offset = the distance to it; what it
 * lacks, from its own start). zstd's decoder copies a match of offset 16 or more 16 to 32
 * bytes at a time, and one whose source was written long before without waiting on its own
 * stores, where a match of offset 1 goes 8 bytes at a time: a plane of nearly all zeros
 * decodes 2-3 times faster than as zstd's level 1 parses it. Shorter runs stay literals: as
 * matches they cost more to decode than they save (16 instead of 32: carry planes 5-20%
 * slower, 3% smaller).
 *
 * The last sequence is the block delimiter (offset 0, match length 0) with the trailing
 * literals. Returns the number of sequences, or (size_t)-1 (ZSTD_SEQUENCE_PRODUCER_ERROR)
 * when they would not fit. */
#define ZERO_RUN 32
typedef struct { unsigned int offset, litLength, matchLength, rep; } zstd_sequence;

static inline void put_sequence(zstd_sequence *out, size_t offset, size_t literals,
                                size_t match)
{
    out->offset = (unsigned int)offset;
    out->litLength = (unsigned int)literals;
    out->matchLength = (unsigned int)match;
    out->rep = 0;
}

static size_t zero_run_sequences(void *state, zstd_sequence *out, size_t capacity,
                                 const void *src, size_t size, const void *dict,
                                 size_t dict_size, int level, size_t window)
{
    const unsigned char *p = src;
    size_t count = 0, literals_from = 0, at = 0, far_start = 0, far_length = 0;
    (void)state; (void)dict; (void)dict_size; (void)level; (void)window;
    while (at + 8 <= size) {
        uint64_t word;
        memcpy(&word, p + at, 8);
        if (word) {
            at += 8;
            continue;
        }
        size_t start = at, end = at + 8;
        while (start > literals_from && p[start - 1] == 0)
            start--;
        while (end < size && p[end] == 0)
            end++;
        size_t length = end - start;
        if (length >= ZERO_RUN) {
            if (count + 3 > capacity)
                return (size_t)-1;
            if (far_length) {
                size_t first = length <= far_length ? length : far_length;
                if (length - first > 0 && length - first < 3)
                    first = length - 3;         /* every match at least 3 bytes */
                put_sequence(out + count++, start - far_start, start - literals_from, first);
                if (first < length)
                    put_sequence(out + count++, first, 0, length - first);
            } else {
                put_sequence(out + count++, 1, start + 1 - literals_from, 15);
                put_sequence(out + count++, 16, 0, length - 16);
            }
            if (length > far_length) {
                far_start = start;
                far_length = length;
            }
            literals_from = end;
        }
        at = end + 7 - (end + 7) % 8;       /* the next aligned word */
    }
    if (count + 1 > capacity)
        return (size_t)-1;
    put_sequence(out + count, 0, size - literals_from, 0);
    return count + 1;
}

static PyObject *zero_run_producer(PyObject *self, PyObject *args)
{
    return PyLong_FromVoidPtr((void *)zero_run_sequences);
}

/* The stored deflate blocks at the start of buf[0:got]: each a header byte (BFINAL in bit 0,
 * BTYPE 00 in bits 1-2), LEN and NLEN little-endian with NLEN == ~LEN, then LEN bytes. Their
 * contents are moved together to the front of buf, block by block, up to the first block
 * that does not end inside the window, or through the final one. Returns 0 and fills
 * *consumed (bytes of blocks taken), *filled (content bytes now at the front), *blocks and
 * *final; -1 when a header is not a stored block's. */
static int join_blocks(unsigned char *buf, Py_ssize_t got, Py_ssize_t *consumed,
                       Py_ssize_t *filled, Py_ssize_t *blocks, int *final)
{
    Py_ssize_t at = 0, out = 0, count = 0;
    *final = 0;
    while (at + 5 <= got) {
        unsigned head = buf[at];
        unsigned len = buf[at + 1] | (unsigned)buf[at + 2] << 8;
        unsigned nlen = buf[at + 3] | (unsigned)buf[at + 4] << 8;
        if ((head & 0x06) || (len ^ nlen) != 0xFFFF)
            return -1;
        if (at + 5 + (Py_ssize_t)len > got)
            break;
        memmove(buf + out, buf + at + 5, len);
        out += len;
        at += 5 + len;
        count++;
        if (head & 1) {
            *final = 1;
            break;
        }
    }
    *consumed = at;
    *filled = out;
    *blocks = count;
    return 0;
}

static PyObject *join_stored_blocks(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t got, consumed, filled, blocks;
    int final, status;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "On:join_stored_blocks", &obj, &got))
        return NULL;
    if (PyObject_GetBuffer(obj, &buf, PyBUF_CONTIG) < 0)
        return NULL;
    if (got < 0 || got > buf.len) {
        PyErr_Format(PyExc_ValueError, "got must be 0..%zd, is %zd", buf.len, got);
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = join_blocks(buf.buf, got, &consumed, &filled, &blocks, &final);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (status < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("nnnO", consumed, filled, blocks, final ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"put_lines", put_lines, METH_VARARGS,
     "put_lines(lines, chars): fill (count, n, width + 3) lines from (count, n, width)\n"
     "characters: the characters, a space, the parity hex digit and LF."},
    {"gather_lines", gather_lines, METH_VARARGS,
     "gather_lines(lines, chars, check) -> bool: copy the characters of (count, n, width + 3)\n"
     "lines into (count, n, width) chars; with check, False as soon as a line does not end in\n"
     "a space, its parity hex digit and LF."},
    {"set_base64_decoder", set_base64_decoder, METH_VARARGS,
     "set_base64_decoder(address): the address of libbase64's base64_decode (as exported by\n"
     "pybase64's extension), used by decode_lines."},
    {"decode_lines", decode_lines, METH_VARARGS,
     "decode_lines(lines, dest, check) -> bool: decode the characters of (count, n, 79) full\n"
     "lines into (count, n, 57) dest (each chunk's rows contiguous), a few hundred lines at a\n"
     "time; False as soon as a line does not end in a space, its parity digit and LF (with\n"
     "check) or its characters are not base64 without padding."},
    {"unshuffle_xor", unshuffle_xor, METH_VARARGS,
     "unshuffle_xor(items, planes, itemsize, sparse=()): items[i * itemsize + k] ^= planes[k\n"
     "* n + i] for the n items of two contiguous buffers of the same length (a whole number\n"
     "of items), but for the planes k that sparse names as (k, bitmap, values): byte i of such\n"
     "a plane is the next of values where bit i of bitmap is set (least significant bit\n"
     "first), else 0, and its place in planes is not read. ValueError, before any byte is\n"
     "touched, unless each bitmap has ceil(n / 8) bytes and no bit past n; ValueError, the\n"
     "items then undefined, unless it sets as many bits as values has bytes."},
    {"compact_nonzero", compact_nonzero, METH_VARARGS,
     "compact_nonzero(plane, bitmap, values) -> int: bit i of bitmap (least significant\n"
     "first; ceil(len(plane) / 8) bytes) set where plane[i] is not 0, those bytes in order at\n"
     "the start of values (room for len(plane); may be plane itself); their number.\n"
     "expand_nonzero undoes it."},
    {"expand_nonzero", expand_nonzero, METH_VARARGS,
     "expand_nonzero(out, bitmap, values): out[i] = the next of values where bit i of bitmap\n"
     "is set (least significant bit first), else 0; ValueError unless bitmap has\n"
     "ceil(len(out) / 8) bytes, no bit past len(out), and as many bits set as values has\n"
     "bytes."},
    {"zero_run_producer", zero_run_producer, METH_NOARGS,
     "zero_run_producer() -> int: the address of a zstd sequence producer\n"
     "(ZSTD_sequenceProducer_F) that makes each run of 32 or more zero bytes matches and\n"
     "everything else literals."},
    {"join_stored_blocks", join_stored_blocks, METH_VARARGS,
     "join_stored_blocks(buf, got) -> (consumed, filled, blocks, final) or None: move the\n"
     "contents of the stored deflate blocks in buf[:got] together to its front, up to the\n"
     "first block not wholly in the window or through the final one; None when a block\n"
     "header is not a stored block's (BTYPE 00, NLEN the complement of LEN)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Byte kernels: WTXT base64 lines, built, checked and decoded (see wtxt/_lines.py),\n"
    "residual unshuffling and parsing for zstd (see generation/residual.py) and stored deflate blocks (see\n"
    "looseobject.py), each in one pass with the GIL released.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    build_spread();
    return PyModule_Create(&module);
}
