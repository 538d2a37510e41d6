// CPU FFI handlers: validate (checks.h), pick the dtype, run the kernel on XLA's
// intra-op thread pool. Nothing here computes; the math is in ffi/cpu.
#include <optional>

#include "checks.h"
#include "common.h"
#include "handlers.h"
#include "cpu/isa_dispatch.h"

namespace oxijax::bindings {
namespace {

using cpu::Parallel;

// XLA's intra-op pool as a Parallel; the calling thread counts as one of its threads.
Parallel parallel_on(ffi::ThreadPool pool) {
  const int64_t workers = pool.num_threads() - 1;
  if (workers <= 0) return Parallel();
  return Parallel(workers, [pool](Parallel::Task task) mutable { pool.Schedule(std::move(task)); });
}

ffi::Error UnaryImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     UnaryOp op) {
  int64_t n;
  if (auto err = check_unary(x, *y, op, n); err.failure()) return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().unary(parallel_on(pool), op, typed<T>(x), typed<T>(y), n);
    return ffi::Error::Success();
  });
}

ffi::Error BinaryImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::Result<ffi::AnyBuffer> out, BinaryOp op) {
  BroadcastShape shape;
  if (auto err = check_binary(a, b, *out, op, shape); err.failure()) return err;
  return dispatch_float(a.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().binary(parallel_on(pool), op, shape, typed<T>(a), typed<T>(b), typed<T>(out));
    return ffi::Error::Success();
  });
}

ffi::Error ReduceImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                      ReduceOp op, int64_t axis) {
  ReduceShape shape;
  if (auto err = check_reduce(x, *out, op, axis, shape); err.failure()) return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().reduce(parallel_on(pool), op, shape, typed<T>(x), typed<T>(out));
    return ffi::Error::Success();
  });
}

// Operands: a, b and, when beta != 0, c. float32 is always exact on the CPU, so
// allow_tf32 changes nothing here.
ffi::Error GemmImpl(ffi::ThreadPool pool, ffi::RemainingArgs operands,
                    ffi::Result<ffi::AnyBuffer> out, Transpose trans_a, Transpose trans_b,
                    double alpha, double beta, bool /*allow_tf32*/) {
  std::optional<ffi::AnyBuffer> a, b, c;
  if (auto err = gemm_operands(operands, a, b, c); err.failure()) return err;
  GemmShape shape;
  if (auto err = check_gemm(*a, *b, c ? &*c : nullptr, *out, trans_a, trans_b, alpha, beta, shape);
      err.failure())
    return err;
  return dispatch_float(a->element_type(), [&](auto t) {
    using T = decltype(t);
    const T* c_data = (c && beta != 0.0) ? typed<T>(*c) : nullptr;
    cpu::kernels<T>().gemm(parallel_on(pool), shape, typed<T>(*a), typed<T>(*b), c_data, typed<T>(out));
    return ffi::Error::Success();
  });
}

ffi::Error Conv2dImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                      ffi::Result<ffi::AnyBuffer> out, int64_t stride_h, int64_t stride_w,
                      int64_t pad_h, int64_t pad_w) {
  ConvShape shape;
  if (auto err = check_conv2d(x, w, *out, stride_h, stride_w, pad_h, pad_w, shape); err.failure())
    return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().conv2d(parallel_on(pool), shape, typed<T>(x), typed<T>(w), typed<T>(out));
    return ffi::Error::Success();
  });
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::AnyBuffer> lse, double scale, bool causal,
                         bool /*allow_tf32: the CPU kernels are exact*/) {
  AttentionShape shape;
  if (auto err = check_attention(q, k, v, *out, *lse, scale, causal, shape); err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().attention(parallel_on(pool), shape, typed<T>(q), typed<T>(k), typed<T>(v),
                   typed<T>(out), typed<Acc<T>>(lse));
    return ffi::Error::Success();
  });
}

ffi::Error AttentionBackwardImpl(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                 ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                                 ffi::AnyBuffer dout, ffi::Result<ffi::AnyBuffer> dq,
                                 ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                                 double scale, bool causal) {
  AttentionShape shape;
  if (auto err = check_attention_backward(q, k, v, out, lse, dout, *dq, *dk, *dv, scale, causal,
                                          shape);
      err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().attention_backward(parallel_on(pool), shape, typed<T>(q), typed<T>(k), typed<T>(v),
                            typed<T>(out), typed<Acc<T>>(lse), typed<T>(dout), typed<T>(dq),
                            typed<T>(dk), typed<T>(dv));
    return ffi::Error::Success();
  });
}

ffi::Error AttentionJvpImpl(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                            ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                            ffi::AnyBuffer dq, ffi::AnyBuffer dk, ffi::AnyBuffer dv,
                            ffi::Result<ffi::AnyBuffer> dout, double scale, bool causal) {
  AttentionShape shape;
  if (auto err = check_attention_jvp(q, k, v, out, lse, dq, dk, dv, *dout, scale, causal, shape);
      err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().attention_jvp(parallel_on(pool), shape, typed<T>(q), typed<T>(k), typed<T>(v),
                       typed<T>(out), typed<Acc<T>>(lse), typed<T>(dq), typed<T>(dk),
                       typed<T>(dv), typed<T>(dout));
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_unary, Handler<UnaryImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<UnaryOp>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_binary, Handler<BinaryImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<BinaryOp>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_reduce, Handler<ReduceImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ReduceOp>("op")
                                  .Attr<int64_t>("axis"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_gemm, Handler<GemmImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<Transpose>("trans_a")
                                  .Attr<Transpose>("trans_b")
                                  .Attr<double>("alpha")
                                  .Attr<double>("beta")
                                  .Attr<bool>("allow_tf32"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_conv2d, Handler<Conv2dImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h")
                                  .Attr<int64_t>("pad_w"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_attention, Handler<AttentionImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal")
                                  .Attr<bool>("allow_tf32"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_attention_backward, Handler<AttentionBackwardImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_attention_jvp, Handler<AttentionJvpImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dq
                                  .Arg<ffi::AnyBuffer>()  // dk
                                  .Arg<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>()  // dout
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal"));

// ---------------------------------------------------------------- backward passes

namespace {

ffi::Error UnaryGradImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer t,
                         ffi::Result<ffi::AnyBuffer> out, UnaryOp op) {
  int64_t n;
  if (auto err = check_unary_grad(x, t, *out, op, n); err.failure()) return err;
  return dispatch_float(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    cpu::kernels<T>().unary_grad(parallel_on(pool), op, typed<T>(x), typed<T>(t), typed<T>(out), n);
    return ffi::Error::Success();
  });
}

ffi::Error BinaryPartialImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> out, BinaryOp op) {
  BroadcastShape shape;
  if (auto err = check_binary_partial(a, b, *out, op, shape); err.failure()) return err;
  return dispatch_float(a.element_type(), [&](auto tag) {
    using T = decltype(tag);
    cpu::kernels<T>().binary_partial(parallel_on(pool), op, shape, typed<T>(a), typed<T>(b), typed<T>(out));
    return ffi::Error::Success();
  });
}

ffi::Error Conv2dBackwardDataImpl(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer w,
                                  ffi::Result<ffi::AnyBuffer> dx, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                  int64_t input_h, int64_t input_w) {
  ConvShape shape;
  if (auto err = check_conv2d_backward_data(dy, w, *dx, stride_h, stride_w, pad_h, pad_w,
                                            input_h, input_w, shape);
      err.failure())
    return err;
  return dispatch_float(dy.element_type(), [&](auto tag) {
    using T = decltype(tag);
    cpu::kernels<T>().conv2d_backward_data(parallel_on(pool), shape, typed<T>(dy), typed<T>(w), typed<T>(dx));
    return ffi::Error::Success();
  });
}

ffi::Error Conv2dBackwardFilterImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                                    ffi::Result<ffi::AnyBuffer> dw, int64_t stride_h,
                                    int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                    int64_t filter_h, int64_t filter_w) {
  ConvShape shape;
  if (auto err = check_conv2d_backward_filter(x, dy, *dw, stride_h, stride_w, pad_h, pad_w,
                                              filter_h, filter_w, shape);
      err.failure())
    return err;
  return dispatch_float(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    cpu::kernels<T>().conv2d_backward_filter(parallel_on(pool), shape, typed<T>(x), typed<T>(dy), typed<T>(dw));
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_unary_grad, Handler<UnaryGradImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<UnaryOp>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cpu_binary_partial, Handler<BinaryPartialImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<BinaryOp>("op"));

#define OXIJAX_CONV_BACKWARD_HANDLER(name, impl, size_h, size_w)     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Handler<impl>::Call,           \
                                ffi::Ffi::Bind()                     \
                                    .Ctx<ffi::ThreadPool>()          \
                                    .Arg<ffi::AnyBuffer>()           \
                                    .Arg<ffi::AnyBuffer>()           \
                                    .Ret<ffi::AnyBuffer>()           \
                                    .Attr<int64_t>("stride_h")       \
                                    .Attr<int64_t>("stride_w")       \
                                    .Attr<int64_t>("pad_h")          \
                                    .Attr<int64_t>("pad_w")          \
                                    .Attr<int64_t>(size_h)           \
                                    .Attr<int64_t>(size_w));
OXIJAX_CONV_BACKWARD_HANDLER(Cpu_conv2d_backward_data, Conv2dBackwardDataImpl, "input_h", "input_w")
OXIJAX_CONV_BACKWARD_HANDLER(Cpu_conv2d_backward_filter, Conv2dBackwardFilterImpl, "filter_h",
                             "filter_w")
#undef OXIJAX_CONV_BACKWARD_HANDLER

}  // namespace oxijax::bindings
