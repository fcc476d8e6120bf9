// The CUDA engine's token choice on the device (greedy argmax or the
// sampler) and the submit_pick / wait_pick pipe around it.
#include "engine_state.h"

namespace intdet {
namespace cuda {

// Argmax of the (one) logits row in w.logits into the pipe's device token
// and its pinned slot.
void enqueue_pick(DeviceModel& m, GreedyPipe& g) {
  if (g.how.t_num)
    launch_sample(m.ws.logits.p, (int)m.cfg.vocab, g.how.t_num, g.how.t_den, g.how.draw, g.wbuf.p, g.pick.p, m.stream,
                  SampleCuts{g.how.top_k, g.how.p_num, g.how.p_den, g.how.m_num, g.how.m_den});
  else
    launch_argmax(m.ws.logits.p, (int)m.cfg.vocab, g.best.p, g.counter.p, g.pick.p, m.stream);
  ck(cudaMemcpyAsync(g.h_pick.p + g.slot, g.pick.p, sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
     "cudaMemcpyAsync (token)");
}

void submit_pick(DeviceModel& m, DeviceState& s, const int32_t* tokens, int64_t T, int64_t start, const Pick& how) {
  GreedyPipe& g = m.greedy;
  if (T <= 0) throw std::invalid_argument("submit_pick: no rows");
  if (how.t_num < 0 || how.t_den <= 0) throw std::invalid_argument("submit_pick: temperature must be >= 0");
  if (how.top_k < 0 || how.p_num <= 0 || how.p_den <= 0 || how.p_num > how.p_den || how.m_num < 0 || how.m_den <= 0 ||
      how.m_num > how.m_den || how.m_den > 1000000)
    throw std::invalid_argument("submit_pick: top-k < 0, top-p outside (0, 1] or min-p outside [0, 1]");
  if (!tokens && (T != 1 || !g.have_pick))
    throw std::invalid_argument("submit_pick: no token was chosen on the device yet (give the tokens)");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  if (g.pending) {  // a step never waited for: its result is dropped
    ck(cudaEventSynchronize(g.done), "greedy step");
    g.pending = false;
  }
  if (!g.done) {
    g.pick.grow(1);
    g.wbuf.grow((size_t)m.cfg.vocab);
    g.best.grow(1);
    g.counter.grow(1);
    ck(cudaMemset(g.best.p, 0, sizeof(unsigned long long)), "cudaMemset");
    ck(cudaMemset(g.counter.p, 0, sizeof(int)), "cudaMemset");
    ck(cudaDeviceSynchronize(), "cudaMemset");  // legacy stream: before the model's stream uses them
    g.h_logits.grow((size_t)(2 * m.cfg.vocab));
    g.h_pick.grow(2);
    ck(cudaEventCreate(&g.done), "cudaEventCreate");
  }
  std::vector<Row> rows((size_t)T);
  for (int64_t t = 0; t < T; ++t) rows[(size_t)t] = Row{0, start + t, tokens ? tokens[t] : 0, t == T - 1};
  g.slot ^= 1;
  g.how = how;
  ChunkOpts opt;
  opt.token_from = tokens ? nullptr : g.pick.p;
  opt.pipe = &g;
  DeviceState* devs[1] = {&s};
  forward_rows_impl(m, devs, 1, rows.data(), T, g.h_logits.p + (int64_t)g.slot * m.cfg.vocab, nullptr, &opt);
  g.pending = true;
  g.have_pick = true;
}

int32_t wait_pick(DeviceModel& m, const int32_t** logits) {
  GreedyPipe& g = m.greedy;
  if (!g.pending) throw std::invalid_argument("wait_pick: no step was submitted");
  ck(cudaSetDevice(m.device), "cudaSetDevice");
  ck(cudaEventSynchronize(g.done), "greedy step");
  g.pending = false;
  *logits = g.h_logits.p + (int64_t)g.slot * m.cfg.vocab;
  return g.h_pick.p[g.slot];
}

}  // namespace cuda
}  // namespace intdet
