// Runs the CPU kernels of one kernel library without Python or XLA, for a machine that
// cannot run the extension: tests/test_cross_compile.py links it statically with the
// aarch64 (NEON) kernels and runs it under qemu-aarch64, the Python side drawing the
// inputs and checking the outputs against float64 references.
//
// Protocol (stdin to stdout, little-endian, any number of calls until end of input):
// each call is one text line (or the line `level`, answered with the library's level)
//   <kernel> <dtype> <threads> <inputs> <outputs> <bytes of each input and output> <params>
// followed by the inputs' bytes; the runner answers with the outputs' bytes. Params are
// numbers, per kernel as listed in run() below. Outputs start filled with 0xff bytes
// (NaN), so an element a kernel never writes shows.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernel_table.h"

// kernel_table.cc's one export.
extern "C" const oxijax::cpu::KernelTable* oxijax_cpu_kernel_table();

namespace {

using namespace oxijax;
using namespace oxijax::cpu;

struct Buffer {
  std::unique_ptr<unsigned char, decltype(&std::free)> data{nullptr, &std::free};
  size_t bytes = 0;
};

Buffer allocate(size_t bytes) {
  Buffer b;
  b.bytes = bytes;
  // 64-byte aligned like XLA's buffers; never a null pointer, even for 0 bytes.
  b.data.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)));
  if (!b.data) throw std::runtime_error("out of memory");
  return b;
}

// The numeric params of a call, taken in order.
class Params {
 public:
  explicit Params(std::vector<double> values) : values_(std::move(values)) {}
  double real() {
    if (next_ == values_.size()) throw std::runtime_error("too few params");
    return values_[next_++];
  }
  int64_t integer() { return static_cast<int64_t>(real()); }
  std::vector<int64_t> integers(int64_t count) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < count; ++i) v.push_back(integer());
    return v;
  }
  void done() const {
    if (next_ != values_.size()) throw std::runtime_error("too many params");
  }

 private:
  std::vector<double> values_;
  size_t next_ = 0;
};

ConvShape conv_shape(Params& p) {
  ConvShape s;
  for (int64_t* field : {&s.groups, &s.n, &s.c, &s.h, &s.w, &s.k, &s.r, &s.s, &s.p, &s.q,
                         &s.stride_h, &s.stride_w, &s.pad_h, &s.pad_w})
    *field = p.integer();
  return s;
}

AttentionShape attention_shape(Params& p) {
  AttentionShape s;
  for (int64_t* field : {&s.batch, &s.heads, &s.seq_q, &s.seq_kv, &s.head_dim})
    *field = p.integer();
  s.scale = p.real();
  s.causal = p.integer() != 0;
  return s;
}

BroadcastShape broadcast_shape(Params& p) {
  const int64_t rank = p.integer();
  BroadcastShape s;
  s.dims = p.integers(rank);
  s.a_strides = p.integers(rank);
  s.b_strides = p.integers(rank);
  return s;
}

GemmShape gemm_shape(Params& p) {
  GemmShape s;
  s.m = p.integer(), s.n = p.integer(), s.k = p.integer();
  s.trans_a = p.integer() != 0, s.trans_b = p.integer() != 0;
  s.alpha = p.real(), s.beta = p.real();
  const int64_t rank = p.integer();
  s.batch_dims = p.integers(rank);
  s.a_batch_strides = p.integers(rank);
  s.b_batch_strides = p.integers(rank);
  s.lda = p.integer(), s.ldb = p.integer(), s.ldc = p.integer();
  s.out_batch_stride = p.integer();
  return s;
}

template <typename T>
void run(const std::string& kernel, const Kernels<T>& k, const Parallel& par, Params& p,
         std::vector<Buffer>& in, std::vector<Buffer>& out) {
  auto I = [&](size_t i) { return reinterpret_cast<const T*>(in.at(i).data.get()); };
  auto O = [&](size_t i) { return reinterpret_cast<T*>(out.at(i).data.get()); };
  auto acc_in = [&](size_t i) { return reinterpret_cast<const Acc<T>*>(in.at(i).data.get()); };
  if (kernel == "unary" || kernel == "unary_grad") {  // op n
    const auto op = static_cast<UnaryOp>(p.integer());
    const int64_t n = p.integer();
    p.done();
    if (kernel == "unary") k.unary(par, op, I(0), O(0), n);
    else k.unary_grad(par, op, I(0), I(1), O(0), n);
  } else if (kernel == "binary" || kernel == "binary_partial") {  // op rank dims a_strides b_strides
    const auto op = static_cast<BinaryOp>(p.integer());
    const BroadcastShape shape = broadcast_shape(p);
    p.done();
    (kernel == "binary" ? k.binary : k.binary_partial)(par, op, shape, I(0), I(1), O(0));
  } else if (kernel == "reduce") {  // op outer axis inner
    const auto op = static_cast<ReduceOp>(p.integer());
    ReduceShape shape;
    shape.outer = p.integer(), shape.axis = p.integer(), shape.inner = p.integer();
    p.done();
    k.reduce(par, op, shape, I(0), O(0));
  } else if (kernel == "gemm") {  // m n k trans_a trans_b alpha beta rank batch.. strides.. ld.. out_stride
    const GemmShape shape = gemm_shape(p);
    p.done();
    k.gemm(par, shape, I(0), I(1), in.size() > 2 ? I(2) : nullptr, O(0));
  } else if (kernel == "conv2d") {  // groups n c h w k r s p q stride_h stride_w pad_h pad_w
    const ConvShape shape = conv_shape(p);
    p.done();
    k.conv2d(par, shape, I(0), I(1), O(0));
  } else if (kernel == "conv2d_backward_data") {  // dy, w -> dx
    const ConvShape shape = conv_shape(p);
    p.done();
    k.conv2d_backward_data(par, shape, I(0), I(1), O(0));
  } else if (kernel == "conv2d_backward_filter") {  // x, dy -> dw
    const ConvShape shape = conv_shape(p);
    p.done();
    k.conv2d_backward_filter(par, shape, I(0), I(1), O(0));
  } else if (kernel == "attention") {  // batch heads seq_q seq_kv head_dim scale causal
    const AttentionShape shape = attention_shape(p);
    p.done();
    k.attention(par, shape, I(0), I(1), I(2), O(0), reinterpret_cast<Acc<T>*>(O(1)));
  } else if (kernel == "attention_backward") {  // q k v out lse dout -> dq dk dv
    const AttentionShape shape = attention_shape(p);
    p.done();
    k.attention_backward(par, shape, I(0), I(1), I(2), I(3), acc_in(4), I(5), O(0), O(1), O(2));
  } else if (kernel == "attention_jvp") {  // q k v out lse dq dk dv -> dout
    const AttentionShape shape = attention_shape(p);
    p.done();
    k.attention_jvp(par, shape, I(0), I(1), I(2), I(3), acc_in(4), I(5), I(6), I(7), O(0));
  } else {
    throw std::runtime_error("unknown kernel " + kernel);
  }
}

void call(const std::string& line) {
  std::istringstream words(line);
  std::string kernel, dtype;
  int64_t threads = 1, inputs = 0, outputs = 0;
  words >> kernel >> dtype >> threads >> inputs >> outputs;
  std::vector<Buffer> in, out;
  for (int64_t i = 0; i < inputs + outputs; ++i) {
    size_t bytes = 0;
    words >> bytes;
    (i < inputs ? in : out).push_back(allocate(bytes));
  }
  std::vector<double> values;
  for (std::string word; words >> word;) values.push_back(std::strtod(word.c_str(), nullptr));
  if (!words.eof()) throw std::runtime_error("bad call line: " + line);
  for (Buffer& b : in)
    if (!std::cin.read(reinterpret_cast<char*>(b.data.get()), std::streamsize(b.bytes)))
      throw std::runtime_error("input ended inside an array");
  for (Buffer& b : out) std::memset(b.data.get(), 0xff, b.bytes);

  // threads - 1 helpers, each task on a thread of its own (the loop waits for them).
  const Parallel par(threads - 1, [](Parallel::Task task) { std::thread(std::move(task)).detach(); });
  Params params(std::move(values));
  const KernelTable& table = *oxijax_cpu_kernel_table();
  if (dtype == "float16") run(kernel, table.f16, par, params, in, out);
  else if (dtype == "bfloat16") run(kernel, table.bf16, par, params, in, out);
  else if (dtype == "float32") run(kernel, table.f32, par, params, in, out);
  else if (dtype == "float64") run(kernel, table.f64, par, params, in, out);
  else throw std::runtime_error("unknown dtype " + dtype);
  for (const Buffer& b : out) std::cout.write(reinterpret_cast<const char*>(b.data.get()), std::streamsize(b.bytes));
  std::cout.flush();
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  try {
    for (std::string line; std::getline(std::cin, line);) {
      if (line == "level") {  // which library this is, e.g. "neon"
        std::cout << oxijax_cpu_kernel_table()->level << "\n" << std::flush;
      } else if (!line.empty()) {
        call(line);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_runner: %s\n", e.what());
    return 1;
  }
  return 0;
}
