// Serving from many threads: THREADS threads call one compiled module for SECONDS seconds with a mix of
// compiled signatures and new ones (each new signature is compiled by the thread that meets it first,
// with the host compiler, while the others keep calling). Every result is checked against eager; the
// latency of calls of already compiled signatures is reported, split by whether a compile was running
// at the time, with an eager run of the same calls in the same run as the baseline.
//
//   build/bench_serving [--threads 8] [--seconds 30] [--new-every-ms 250]
//
// Exits 1 when a result differs from eager's or a thread stopped making progress (a deadlock), else 0.
//
//   build/bench_serving --new-lengths N
//
// One thread: a transformer block (frozen weights; attention written out, layer norms, a GELU MLP) at
// batch 2 and N + 2 sequence lengths, in two settings in turn, each compiled afresh (the kernel cache
// kept): the default, where a new length's plan is an instance of the shape class of its captures (Note
// [Shape classes of captured graphs]), and disable="symbolic.class", where each is planned on its own
// (passes, fusion, code generation; no compiler: the kernels are the class's). Per setting, medians over
// the lengths after the first two: a new length's first call (capture included), its second (the plan's
// first run: weights a plan reorders are reordered then), its steady call (the median of 10 more), and
// eager's call; then the steady calls' ratio per length. Exits 1 when a result differs from eager's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusion_jit/fusion_jit.h"
#include "torch/tolerance.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Latencies {
  std::vector<double> ms;
  void add(double v) { ms.push_back(v); }
  double pct(double p) {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[std::min(ms.size() - 1, static_cast<size_t>(p * static_cast<double>(ms.size())))];
  }
};

std::vector<at::Tensor> flatten(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTuple())
    for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  return out;
}

// --new-lengths: what a new sequence length's first call costs, with and without shape classes.
int new_lengths(int n) {
  at::set_num_threads(2);
  torch::jit::Module m("Block");
  const int64_t h = 64;
  m.register_parameter("wq", at::randn({h, h}) * 0.1, false);
  m.register_parameter("wk", at::randn({h, h}) * 0.1, false);
  m.register_parameter("wv", at::randn({h, h}) * 0.1, false);
  m.register_parameter("w1", at::randn({4 * h, h}) * 0.1, false);
  m.register_parameter("w2", at::randn({h, 4 * h}) * 0.1, false);
  m.register_parameter("g", at::ones({h}), false);
  m.define(R"(
def forward(self, x):
    b, l, h = x.size()
    y = torch.layer_norm(x, [h], self.g)
    q = torch.linear(y, self.wq).view(b, l, 4, h // 4).transpose(1, 2)
    k = torch.linear(y, self.wk).view(b, l, 4, h // 4).transpose(1, 2)
    v = torch.linear(y, self.wv).view(b, l, 4, h // 4).transpose(1, 2)
    a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 4.0, -1)
    o = torch.matmul(a, v).transpose(1, 2).reshape(b, l, h) + x
    z = torch.layer_norm(o, [h], self.g)
    return o + torch.linear(torch.gelu(torch.linear(z, self.w1)), self.w2)
)");
  m.eval();
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < n + 2; ++i) {
    inputs.push_back({at::randn({2, 5 + 3 * i, h})});
    expected.push_back(m.forward(inputs.back()).toTensor());
  }
  int64_t mismatches = 0;
  std::printf("bench_serving --new-lengths %d: batch 2, lengths 5-%d, hidden %lld, 2 threads; medians over the %d "
              "lengths after the first two (ms)\n",
              n, 5 + 3 * (n + 1), static_cast<long long>(h), n);
  std::printf("%-42s %10s %10s %10s %10s %10s\n", "setting", "first call", "second", "steady", "eager", "compile_ms");
  std::vector<double> steady_of[2];  // per length: the median of 10 calls after the second
  for (const bool classes : {true, false}) {
    fusion_jit::CompileOptions o;
    o.specialization_limit = 1000;
    if (!classes) o.disable = {"symbolic.class"};
    auto fused = fusion_jit::compile(m, o);
    Latencies first, second, steady, eager;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto t0 = Clock::now();
      at::Tensor got = fused(inputs[i]).toTensor();
      const double ms = ms_between(t0, Clock::now());
      if (!fusion_jit::check_close(got, expected[i]).ok) mismatches++;
      if (i < 2) continue;
      first.add(ms);
      t0 = Clock::now();
      got = fused(inputs[i]).toTensor();
      second.add(ms_between(t0, Clock::now()));
      if (!fusion_jit::check_close(got, expected[i]).ok) mismatches++;
      Latencies calls;
      for (int r = 0; r < 10; ++r) {
        t0 = Clock::now();
        fused(inputs[i]);
        calls.add(ms_between(t0, Clock::now()));
      }
      steady.add(calls.pct(0.5));
      steady_of[classes ? 0 : 1].push_back(calls.pct(0.5));
      t0 = Clock::now();
      m.forward(inputs[i]);
      eager.add(ms_between(t0, Clock::now()));
    }
    std::printf("%-42s %10.3f %10.3f %10.3f %10.3f %10.1f\n",
                classes ? "instances of the shape class (default)" : "each length planned (symbolic.class off)",
                first.pct(0.5), second.pct(0.5), steady.pct(0.5), eager.pct(0.5), fused.stats().compile_ms);
  }
  Latencies ratio;
  for (size_t i = 0; i < steady_of[0].size(); ++i) ratio.add(steady_of[0][i] / steady_of[1][i]);
  std::printf("steady call, instance / planned alone, per length: median %.3f, min %.3f, max %.3f\n", ratio.pct(0.5),
              ratio.pct(0.0), ratio.pct(1.0));
  std::printf("results differing from eager: %lld\n", static_cast<long long>(mismatches));
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 8;
  double seconds = 30, new_every_ms = 250;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--new-lengths") {
      torch::jit::setGraphExecutorOptimize(false);
      const int n = std::atoi(argv[i + 1]);
      if (n < 1) {
        std::fprintf(stderr, "bench_serving: --new-lengths must be positive\n");
        return 2;
      }
      return new_lengths(n);
    }
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--new-every-ms") new_every_ms = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_serving: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads < 1 || seconds <= 0 || new_every_ms <= 0) {
    std::fprintf(stderr, "bench_serving: --threads, --seconds and --new-every-ms must be positive\n");
    return 2;
  }
  torch::jit::setGraphExecutorOptimize(false);
  at::set_num_threads(1);  // each serving thread runs its calls on its own core share
  torch::jit::Module m("Served");
  m.define(R"(
def forward(self, x, y):
    a = torch.relu(x) * y + 1.0
    b = torch.softmax(a * 0.5, 1)
    return (a.sum(1), b * torch.sigmoid(y))
)");
  m.eval();
  fusion_jit::CompileOptions opts;
  opts.specialization_limit = 1000;
  auto fused = fusion_jit::compile(m, opts);

  // Signature k: [4 + k, 64] inputs. The first `warm` are compiled before the clock starts.
  const int warm = 4;
  const int max_sigs = warm + static_cast<int>(seconds * 1000 / new_every_ms) + 1;
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<std::vector<at::Tensor>> expected;
  for (int k = 0; k < max_sigs; ++k) {
    inputs.push_back({at::randn({4 + k, 64}), at::randn({4 + k, 64})});
    expected.push_back(flatten(m.forward(inputs.back())));
  }
  for (int k = 0; k < warm; ++k) fused(inputs[k]);

  // The baseline: eager on the compiled signatures, one thread.
  Latencies eager;
  for (int i = 0; i < 2000; ++i) {
    auto t0 = Clock::now();
    m.forward(inputs[i % warm]);
    eager.add(ms_between(t0, Clock::now()));
  }

  std::atomic<int> next_new{warm};   // the next signature not yet called
  std::atomic<int> compiling{0};     // calls of new signatures in progress
  std::atomic<int64_t> mismatches{0}, calls{0}, new_calls{0};
  std::vector<std::atomic<int64_t>> progress(threads);
  std::mutex lat_mu;
  Latencies quiet, during;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      Latencies q, d;
      uint64_t rng = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(t + 1);
      auto last_new = Clock::now();
      while (Clock::now() < end) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int k;
        bool is_new = false;
        // Thread 0 brings a new signature every new_every_ms; the others call compiled ones.
        if (t == 0 && ms_between(last_new, Clock::now()) >= new_every_ms && next_new < max_sigs) {
          k = next_new++;
          is_new = true;
          last_new = Clock::now();
        } else {
          k = static_cast<int>(rng % static_cast<uint64_t>(std::max(warm, next_new.load() - 1)));
        }
        bool busy = compiling.load() > 0;
        if (is_new) compiling++;
        auto t0 = Clock::now();
        auto got = flatten(fused(inputs[k]));
        double ms = ms_between(t0, Clock::now());
        if (is_new) compiling--, new_calls++;
        else (busy || compiling.load() > 0 ? d : q).add(ms);
        for (size_t o = 0; o < got.size(); ++o)
          if (!fusion_jit::check_close(got[o], expected[k][o]).ok) mismatches++;
        calls++;
        progress[t]++;
      }
      std::lock_guard<std::mutex> g(lat_mu);
      quiet.ms.insert(quiet.ms.end(), q.ms.begin(), q.ms.end());
      during.ms.insert(during.ms.end(), d.ms.begin(), d.ms.end());
    });
  for (auto& th : pool) th.join();
  double wall = ms_between(start, Clock::now()) / 1000;
  int stalled = 0;
  for (auto& p : progress) stalled += p.load() == 0;

  auto st = fused.stats();
  std::printf("bench_serving: %d threads, %.1f s, %lld calls (%lld of new signatures), %lld signatures compiled, "
              "%.1f ms compiling in all\n",
              threads, wall, static_cast<long long>(calls.load()), static_cast<long long>(new_calls.load()),
              static_cast<long long>(st.signatures), st.compile_ms);
  std::printf("%-44s %8s %8s %8s %8s %8s\n", "latency of a compiled signature's call (ms)", "count", "p50", "p99",
              "p99.9", "max");
  auto row = [](const char* what, Latencies& l) {
    std::printf("%-44s %8zu %8.3f %8.3f %8.3f %8.3f\n", what, l.ms.size(), l.pct(0.5), l.pct(0.99), l.pct(0.999),
                l.pct(1.0));
  };
  row("eager, one thread (baseline)", eager);
  row("fused, no compile running", quiet);
  row("fused, while another signature compiles", during);
  std::printf("results differing from eager: %lld; threads that made no progress: %d\n",
              static_cast<long long>(mismatches.load()), stalled);
  return mismatches.load() == 0 && stalled == 0 ? 0 : 1;
}
