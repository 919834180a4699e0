// Ring attention (Note [Ring attention]) and Ulysses (Note [Ulysses]) as autograd functions.
#include "dtorch/parallel/cp/attention.h"

#include <torch/autograd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dtorch/core/error.h"
#include "dtorch/parallel/autograd_group.h"
#include "dtorch/parallel/cp/sequence_chunks.h"

namespace dtorch::cp {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Point-to-point tags of the group's messages (its communicator carries nothing else).
constexpr int kAllToAllTag = 0, kForwardTag = 1, kBackwardTag = 2, kGradientTag = 3;

// Blocks are computed and merged in float32, or in float64 for float64 inputs.
torch::ScalarType accumulation(const Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Which keys of a key chunk the queries of a query chunk attend to.
enum class Seen { None, Diagonal, Whole };
Seen seen(int64_t query_chunk, int64_t key_chunk, bool causal) {
  if (!causal || key_chunk < query_chunk) return Seen::Whole;
  return key_chunk == query_chunk ? Seen::Diagonal : Seen::None;
}

// The blocks a step computes: for each of the rank's query chunks, the key tokens it attends to
// in the block held this step (both chunks as one block where it sees both whole), of which
// the first `real` are the sequence's and the rest padding (Note [Padded sequences]).
struct Block {
  int query_half;
  int64_t key_begin, keys;
  bool diagonal;
  int64_t real;
};
// `tokens`: the sequence's real tokens, of 2n chunks of c.
std::vector<Block> blocks_of(const std::array<int64_t, 2>& mine,
                             const std::array<int64_t, 2>& theirs, int64_t c, bool causal,
                             int64_t tokens) {
  auto real_in = [&](int64_t chunk) { return std::clamp<int64_t>(tokens - chunk * c, 0, c); };
  const int64_t head_real = real_in(theirs[0]), tail_real = real_in(theirs[1]);
  std::vector<Block> out;
  auto add = [&](int a, int64_t begin, int64_t keys, bool diagonal, int64_t real) {
    if (real > 0) out.push_back({a, begin, keys, diagonal, real});  // else padding only
  };
  for (int a = 0; a < 2; ++a) {
    const Seen head = seen(mine[a], theirs[0], causal), tail = seen(mine[a], theirs[1], causal);
    if (head == Seen::Whole && tail == Seen::Whole) {
      // The tail chunk follows the head chunk, so it is real only where the head is whole.
      add(a, 0, 2 * c, false, head_real + tail_real);
      continue;
    }
    if (head != Seen::None) add(a, 0, c, head == Seen::Diagonal, head_real);
    if (tail != Seen::None) add(a, c, c, tail == Seen::Diagonal, tail_real);
  }
  return out;
}

// Float32 scores of queries q (B x h x a x d) against the block's keys k (B x h x b x d), the
// future masked on a diagonal block and the padding after the block's real keys.
Tensor scores(const Tensor& q, const Tensor& k, double scale, const Block& b) {
  Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const double minus_inf = -std::numeric_limits<double>::infinity();
  if (b.diagonal) {
    Tensor future = torch::ones({s.size(-2), s.size(-1)},
                                torch::TensorOptions().dtype(torch::kBool).device(s.device()))
                        .triu(1);
    s.masked_fill_(future, minus_inf);
  }
  if (b.real < b.keys) s.narrow(-1, b.real, b.keys - b.real).fill_(minus_inf);
  return s;
}

// The ring's neighbours, and one step's exchange of a buffer with them.
struct Ring {
  CommPtr group;
  int rank, size, next, prev;
  explicit Ring(CommPtr g)
      : group(std::move(g)),
        rank(group->rank()),
        size(group->size()),
        next((rank + 1) % size),
        prev((rank - 1 + size) % size) {}

  // Sends `mine` to the next rank and receives the previous rank's into a buffer like it.
  struct Pass {
    Tensor incoming;
    comm::Work sent, received;
    Tensor wait() {
      received.wait();
      sent.wait();
      return incoming;
    }
  };
  Pass pass(const Tensor& mine, int tag) const {
    Pass p;
    p.incoming = torch::empty_like(mine);
    p.received = group->irecv(p.incoming, prev, tag);
    p.sent = group->isend(mine, next, tag);
    return p;
  }
};

struct RingAttention : torch::autograd::Function<RingAttention> {
  static Tensor forward(AutogradContext* ctx, Tensor q, Tensor k, Tensor v, CommPtr group,
                        bool causal, int64_t tokens) {
    const Ring ring(group);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const int64_t c = q.size(2) / 2;
    if (tokens == 0) tokens = 2 * c * ring.size;
    const auto mine = chunks_of(ring.rank, ring.size);
    const torch::ScalarType acc = accumulation(q);
    const Tensor qf = q.to(acc);
    std::array<Tensor, 2> out, lse;
    for (int a = 0; a < 2; ++a) {
      out[a] = torch::zeros_like(qf.narrow(2, a * c, c));
      lse[a] = torch::full_like(out[a].select(-1, 0), -std::numeric_limits<double>::infinity());
    }
    Tensor kv = torch::stack({k, v}).contiguous();
    for (int s = 0; s < ring.size; ++s) {
      Ring::Pass next;
      if (s + 1 < ring.size) next = ring.pass(kv, kForwardTag);
      const Tensor kf = kv[0].to(acc), vf = kv[1].to(acc);
      const int src = (ring.rank - s + ring.size) % ring.size;
      for (const Block& b : blocks_of(mine, chunks_of(src, ring.size), c, causal, tokens)) {
        const int a = b.query_half;
        Tensor sc = scores(qf.narrow(2, a * c, c), kf.narrow(2, b.key_begin, b.keys), scale, b);
        Tensor l = sc.logsumexp(-1);
        Tensor o = torch::matmul((sc - l.unsqueeze(-1)).exp(), vf.narrow(2, b.key_begin, b.keys));
        Tensor total = torch::logaddexp(lse[a], l);
        out[a] =
            out[a] * (lse[a] - total).exp().unsqueeze(-1) + o * (l - total).exp().unsqueeze(-1);
        lse[a] = total;
      }
      if (s + 1 < ring.size) kv = next.wait();
    }
    Tensor o = torch::cat({out[0], out[1]}, 2);
    ctx->save_for_backward({q, k, v, o, torch::cat({lse[0], lse[1]}, 2)});
    parallel::keep_group(ctx, "cp", group);
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["tokens"] = tokens;
    return o.to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const Ring ring(parallel::kept_group(ctx, "cp"));
    const bool causal = ctx->saved_data["causal"].toBool();
    const int64_t tokens = ctx->saved_data["tokens"].toInt();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const int64_t c = q.size(2) / 2;
    const auto mine = chunks_of(ring.rank, ring.size);
    const torch::ScalarType acc = accumulation(q);
    const Tensor qf = q.to(acc), dout = grads[0].to(acc);
    // Flash attention's D: the row sums of dout * out, which softmax's backward subtracts.
    const Tensor delta = (dout * o).sum(-1);
    Tensor dq = torch::zeros_like(qf);
    Tensor kv = torch::stack({k, v}).contiguous();
    Ring::Pass gradient;  // the key/value gradient travelling the ring with its block
    for (int s = 0; s < ring.size; ++s) {
      Ring::Pass next;
      if (s + 1 < ring.size) next = ring.pass(kv, kBackwardTag);
      const Tensor kf = kv[0].to(acc), vf = kv[1].to(acc);
      Tensor dkv = torch::zeros({2, kf.size(0), kf.size(1), kf.size(2), kf.size(3)}, kf.options());
      const int src = (ring.rank - s + ring.size) % ring.size;
      for (const Block& b : blocks_of(mine, chunks_of(src, ring.size), c, causal, tokens)) {
        const int64_t a0 = b.query_half * c;
        const Tensor qa = qf.narrow(2, a0, c), da = dout.narrow(2, a0, c);
        const Tensor kb = kf.narrow(2, b.key_begin, b.keys), vb = vf.narrow(2, b.key_begin, b.keys);
        Tensor p = (scores(qa, kb, scale, b) - lse.narrow(2, a0, c).unsqueeze(-1)).exp();
        dkv[1].narrow(2, b.key_begin, b.keys).add_(torch::matmul(p.transpose(-2, -1), da));
        Tensor ds =
            p * (torch::matmul(da, vb.transpose(-2, -1)) - delta.narrow(2, a0, c).unsqueeze(-1));
        dq.narrow(2, a0, c).add_(torch::matmul(ds, kb) * scale);
        dkv[0].narrow(2, b.key_begin, b.keys).add_(torch::matmul(ds.transpose(-2, -1), qa) * scale);
      }
      if (s > 0) dkv += gradient.wait();
      if (ring.size > 1) gradient = ring.pass(dkv, kGradientTag);
      if (s + 1 < ring.size) kv = next.wait();
      if (ring.size == 1) gradient.incoming = dkv;
    }
    // The last hop brings home this rank's block's gradient, with every rank's contribution.
    const Tensor dkv = ring.size > 1 ? gradient.wait() : gradient.incoming;
    return {dq.to(q.scalar_type()),
            dkv[0].to(k.scalar_type()),
            dkv[1].to(v.scalar_type()),
            Tensor(),
            Tensor(),
            Tensor()};
  }
};

// x split in group-size parts along `split_dim`, part j to rank j; what arrives concatenated
// along `cat_dim` in rank order.
Tensor exchange(const Tensor& x, const CommPtr& group, int64_t split_dim, int64_t cat_dim) {
  const int n = group->size();
  DTORCH_CHECK(x.size(split_dim) % n == 0, "all-to-all of ", x.sizes(), " along dim ", split_dim,
               " over ", n, " ranks");
  std::vector<Tensor> parts, received;
  for (const Tensor& part : x.chunk(n, split_dim)) {
    parts.push_back(part.contiguous());
    received.push_back(torch::empty_like(parts.back()));
  }
  group->all_to_all(received, parts, kAllToAllTag);
  return torch::cat(received, cat_dim);
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static Tensor forward(AutogradContext* ctx, Tensor x, CommPtr group, int64_t split_dim,
                        int64_t cat_dim) {
    parallel::keep_group(ctx, "cp", group);
    ctx->saved_data["split"] = split_dim;
    ctx->saved_data["cat"] = cat_dim;
    return exchange(x, group, split_dim, cat_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {exchange(grads[0], parallel::kept_group(ctx, "cp"), ctx->saved_data["cat"].toInt(),
                     ctx->saved_data["split"].toInt()),
            Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

Tensor ring_attention(const Tensor& qkv, const CommPtr& group, bool causal, int64_t tokens) {
  auto [q, k, v] = models::unpack_heads(qkv);
  return RingAttention::apply(q, k, v, group, causal, tokens);
}

Tensor ulysses_attention(const Tensor& qkv, const CommPtr& group, bool causal,
                         models::AttentionKernel kernel, int64_t tokens) {
  const int n = group->size();
  const int64_t heads = qkv.size(2), local = qkv.size(3);
  DTORCH_CHECK_T(ConfigError, heads % n == 0, "Ulysses gives each of the ", n,
                 " context-parallel ranks 1/", n, " of the attention heads, and ", heads,
                 " head(s) (per tensor-parallel rank) do not divide: use --cp-kind ring, or a --cp "
                 "that divides the heads");
  // 3 x B x heads/n x n local x d, the ranks' tokens in rank order, then in the sequence's.
  const Tensor order = sequence_order(local, n, qkv.device());
  Tensor whole = AllToAll::apply(qkv, group, 2, 3).index_select(3, order);
  Tensor y;
  // unbind: its backward is one stack (Note [Unpacking q, k and v]).
  if (tokens == 0 || tokens == whole.size(3)) {
    auto qkv_parts = whole.unbind(0);
    y = models::attention(qkv_parts[0], qkv_parts[1], qkv_parts[2], causal, kernel);
  } else {  // Note [Padded sequences]: the real prefix attends to itself; padding reads zeros
    auto real = whole.narrow(3, 0, tokens).unbind(0);
    y = models::attention(real[0], real[1], real[2], causal, kernel);
    y = torch::cat({y, torch::zeros_like(whole[0].narrow(2, tokens, whole.size(3) - tokens))}, 2);
  }
  return AllToAll::apply(y.index_select(2, torch::argsort(order)), group, 2, 1);
}

}  // namespace dtorch::cp
