/* Each row's LoRA update from its own adapter slot, added to a bf16 product's outputs in one
   pass: y[r] += (x[r] A_s^T) B_s^T for s = slot[r] (rows of slot -1, or any slot outside
   0 .. slots-1, are left alone). A and B are read in bf16, everything is computed and
   accumulated in float32, and y is rounded to bf16 once (round to nearest even), so a row's
   result depends on that row and its slot only, never on the rows beside it.

   Built at first use by lora_rows.py (gcc -O3 -march=native -fopenmp) and called through
   ctypes; the loops are written so that gcc vectorizes them (lanes of independent sums). */
#include <stdint.h>
#include <string.h>

#define LANES 16 /* independent partial sums of a dot product */
#define OUTS 64  /* outputs accumulated at once, per row */
#define ROWS 4   /* rows of one slot sharing each B chunk */

static inline float from_bf16(uint16_t v) {
  uint32_t bits = (uint32_t)v << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static float dot(const float* x, const uint16_t* a, int n) {
  float lanes[LANES] = {0};
  int k = 0;
  for (; k + LANES <= n; k += LANES)
    for (int l = 0; l < LANES; l++) lanes[l] += x[k + l] * from_bf16(a[k + l]);
  float total = 0.f;
  for (; k < n; k++) total += x[k] * from_bf16(a[k]);
  for (int l = 0; l < LANES; l++) total += lanes[l];
  return total;
}

/* Up to ROWS rows (`picked`) of one slot: its A rows `a` [used][in], its B^T `b` [used][out]. */
static void add_block(const uint16_t* x, long x_stride, uint16_t* y, long y_stride,
                      const uint16_t* a, const uint16_t* b, const int* picked, int n, int in,
                      int out, int used) {
  float xf[ROWS][in], h[ROWS][used];
  for (int i = 0; i < n; i++) {
    const uint16_t* row = x + picked[i] * x_stride;
    for (int k = 0; k < in; k++) xf[i][k] = from_bf16(row[k]);
    for (int j = 0; j < used; j++) h[i][j] = dot(xf[i], a + (long)j * in, in);
  }
  for (int i = n; i < ROWS; i++)
    for (int j = 0; j < used; j++) h[i][j] = 0.f;
  int o0 = 0;
  for (; o0 + OUTS <= out; o0 += OUTS) {
    float acc[ROWS][OUTS];
    memset(acc, 0, sizeof acc);
    for (int j = 0; j < used; j++) {
      const uint16_t* bj = b + (long)j * out + o0;
      float chunk[OUTS];
      for (int l = 0; l < OUTS; l++) chunk[l] = from_bf16(bj[l]);
      for (int i = 0; i < ROWS; i++) {
        float hij = h[i][j];
        for (int l = 0; l < OUTS; l++) acc[i][l] += hij * chunk[l];
      }
    }
    for (int i = 0; i < n; i++) {
      uint16_t* row = y + picked[i] * y_stride + o0;
      for (int l = 0; l < OUTS; l++) row[l] = to_bf16(from_bf16(row[l]) + acc[i][l]);
    }
  }
  for (; o0 < out; o0++) {
    for (int i = 0; i < n; i++) {
      float total = 0.f;
      for (int j = 0; j < used; j++) total += h[i][j] * from_bf16(b[(long)j * out + o0]);
      uint16_t* row = y + picked[i] * y_stride;
      row[o0] = to_bf16(from_bf16(row[o0]) + total);
    }
  }
}

/* x: [rows][in] bf16 (row stride x_stride); y: [rows][out] bf16 (row stride y_stride), updated
   in place; a: [slots][width][in] bf16 (each slot's A rows); b: [slots][width][out] bf16 (each
   slot's B^T); slot: [rows]; the first `used` of `width` ranks are read. The rows are cut into
   blocks of up to ROWS rows of one slot, slot by slot, so each slot's weights come from memory
   once; the blocks are shared among up to `threads` OpenMP threads (torch's own runtime,
   libgomp, already loaded: one pool). */
void lora_rows_add(const uint16_t* x, long x_stride, uint16_t* y, long y_stride,
                   const uint16_t* a, const uint16_t* b, const int64_t* slot, int rows, int in,
                   int out, int width, int used, int slots, int threads) {
  int blocks = 0;
  int block_slot[rows], block_size[rows], block_rows[rows][ROWS];
  for (int s = 0; s < slots; s++) {
    int n = 0;
    for (int r = 0; r < rows; r++) {
      if (slot[r] != s) continue;
      if (n == 0) blocks++;
      block_slot[blocks - 1] = s;
      block_rows[blocks - 1][n++] = r;
      block_size[blocks - 1] = n;
      if (n == ROWS) n = 0;
    }
  }
  int team = threads < blocks ? threads : blocks;
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
  for (int i = 0; i < blocks; i++) {
    int s = block_slot[i];
    add_block(x, x_stride, y, y_stride, a + (long)s * width * in, b + (long)s * width * out,
              block_rows[i], block_size[i], in, out, used);
  }
}
