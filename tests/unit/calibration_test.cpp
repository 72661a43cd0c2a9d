// Calibration (Note [Calibration], cost/calibration.h, driver/calibrate.h): measured with our own kernels
// on this machine (serially here: the unit tests have no thread pool), kept in the kernel cache, read
// back as hostile input, and what the cost model and the plan cache take from it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "cost/calibration.h"
#include "cost/kernel_time.h"
#include "driver/build_plan.h"
#include "driver/calibrate.h"
#include "driver/plan_cache.h"
#include "kernels_cache/kernels_cache.h"

namespace fusion_jit {
namespace {

Calibration example() {
  Calibration c;
  c.machine = calibration_machine();
  c.threads = 2;
  c.streams = {{32 << 10, 60.0, 110.0}, {128 << 20, 9.0, 14.5}};
  c.kernel_us = 0.05;
  c.parallel_kernel_us = 3.5;
  c.aten_step_us = 2.25;
  c.kernel_step_us = 0.75;
  c.gemm_gflops = 150;
  c.conv_step_us = 6.5;
  c.op_ns = {{"exp", 0.5}, {"erf", 1.5}};
  c.vector_floats = 16;
  c.seconds = 4.5;
  return c;
}

// Restores the process's calibration (none) when a test that installs one ends.
struct Uninstall {
  ~Uninstall() { install_host_calibration(std::nullopt); }
};

TEST(Calibration, MeasuresThisMachineWithItsOwnKernels) {
  CalibrateOptions o;  // no pool: one thread
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  o.aten_step_us = [] { return 1.75; };
  const Calibration c = calibrate_host(o);
  EXPECT_EQ(c.machine, calibration_machine());
  EXPECT_EQ(c.threads, 1);
  ASSERT_EQ(c.streams.size(), 5u);
  for (size_t i = 0; i < c.streams.size(); ++i) {
    EXPECT_GT(c.streams[i].gbps_1, 0.1) << i;
    EXPECT_LT(c.streams[i].gbps_1, 1e4) << i;
    EXPECT_EQ(c.streams[i].gbps_1, c.streams[i].gbps_n) << "one thread: the same figure";
    if (i > 0) {
      EXPECT_GT(c.streams[i].bytes, c.streams[i - 1].bytes);
    }
  }
  // No order between the working sets is asserted: it is a timing, and a sanitized or loaded machine
  // streams every working set at about one speed (ASan: 5.1 GB/s from L1 and 4.8 from memory).
  EXPECT_GT(c.kernel_us, 0);
  EXPECT_TRUE(std::isfinite(c.kernel_us));
  EXPECT_EQ(c.aten_step_us, 1.75);
  ASSERT_EQ(c.op_ns.size(), 8u);
  double exp_ns = -1, sqrt_ns = -1;
  for (const auto& [name, ns] : c.op_ns) {
    EXPECT_GE(ns, 0) << name;
    if (name == "exp") exp_ns = ns;
    if (name == "sqrt") sqrt_ns = ns;
  }
  EXPECT_GE(exp_ns, 0);
  EXPECT_GE(sqrt_ns, 0);
  EXPECT_TRUE(c.vector_floats == 4 || c.vector_floats == 8 || c.vector_floats == 16) << c.vector_floats;
  EXPECT_GE(lines.size(), 8u);  // compiling, five streams, dispatch, ATen step, op classes
  EXPECT_GT(c.seconds, 0);
}

TEST(Calibration, JsonRoundTripsAndHostileRecordsAreRefusedWithAReason) {
  const Calibration c = example();
  std::string why;
  const std::optional<Calibration> back = calibration_from_json(calibration_to_json(c), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->fingerprint(), c.fingerprint());
  EXPECT_EQ(back->streams.size(), 2u);
  EXPECT_EQ(back->op_ns.size(), 2u);

  const std::string good = calibration_to_json(c);
  auto refused = [&](const std::string& from, const std::string& to, const std::string& reason) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::string w;
    EXPECT_FALSE(calibration_from_json(text, &w)) << text;
    EXPECT_NE(w.find(reason), std::string::npos) << w;
  };
  refused("\"format\": 1", "\"format\": 2", "format");
  refused("\"threads\": 2", "\"threads\": 0", "threads");
  refused("\"threads\": 2", "\"threads\": \"2\"", "threads");
  refused("\"gbps_1\": 9.0", "\"gbps_1\": -9.0", "stream");
  refused("\"gbps_1\": 9.0", "\"gbps_1\": 1e300", "stream");
  refused("\"kernel_us\": 0.05", "\"kernel_us\": 0", "kernel times");
  refused("\"exp\": 0.5", "\"exp\": -0.5", "op_ns exp");
  refused("\"vector_floats\": 16", "\"vector_floats\": 4096", "vector_floats");
  refused("\"threads\": 2", "\"threads\": 2.5", "threads");
  refused("\"bytes\": 134217728", "\"bytes\": 32768", "increasing");  // the largest working set is last
  refused("\"gemm_gflops\": 150.0", "\"gemm_gflops\": 1e300", "gemm_gflops");
  refused("\"kernel_step_us\": 0.75", "\"kernel_step_us\": -7", "kernel_step_us");
  refused("\"conv_step_us\": 6.5", "\"conv_step_us\": \"x\"", "conv_step_us");
  // A record stored before the step probes and the GEMM rate were measured loads: those are not measured.
  {
    nlohmann::json j = nlohmann::json::parse(good);
    j.erase("gemm_gflops");
    j.erase("kernel_step_us");
    j.erase("conv_step_us");
    std::optional<Calibration> old = calibration_from_json(j.dump(), &why);
    ASSERT_TRUE(old) << why;
    EXPECT_EQ(old->gemm_gflops, -1);
    EXPECT_EQ(old->kernel_step_us, -1);
    const TimeFigures f = time_figures(old, 2, 32768);
    EXPECT_EQ(f.gemm_gflops, time_figures(std::nullopt, 2, 32768).gemm_gflops) << "the default stands in";
    EXPECT_EQ(time_figures(c, 2, 32768).gemm_gflops, 150);
    EXPECT_EQ(time_figures(c, 2, 32768).calibration, c.fingerprint());
  }
  std::string w;
  EXPECT_FALSE(calibration_from_json("{\"format\": 1", &w));
  EXPECT_EQ(w, "not a JSON object");
  EXPECT_FALSE(calibration_from_json("[1, 2]", &w));
  EXPECT_FALSE(calibration_from_json("", &w));
}

TEST(Calibration, TheCostModelTakesItsFiguresAndThePlanCacheKeyNamesIt) {
  Uninstall restore;
  const Calibration c = example();
  const DeviceDescription d = default_host_cpu_description();
  const DeviceDescription m = calibrated(d, c);
  EXPECT_EQ(m.memory_gbps, 14.5);   // the largest working set, all threads
  EXPECT_EQ(m.launch_us, 3.5);      // split across the pool
  EXPECT_EQ(m.aten_step_us, 2.25);
  EXPECT_DOUBLE_EQ(m.gflops, 20.0 / 1.0 * 2);  // 20 flops per expensive op at the mean 1.0 ns, 2 threads
  EXPECT_EQ(m.calibration, c.fingerprint());
  EXPECT_EQ(m.cores, d.cores);
  EXPECT_EQ(d.calibration, "");

  auto g = parse_graph("graph(%0 : f32[8]):\n  %1 : f32[8] = aten::exp(%0)\n  return (%1)\n");
  const std::string before = plan_cache_key(*g, PlanTarget{}, "");
  EXPECT_EQ(host_cpu_description().calibration, "");
  install_host_calibration(c);
  EXPECT_EQ(host_cpu_description().memory_gbps, 14.5);
  EXPECT_NE(plan_cache_key(*g, PlanTarget{}, ""), before) << "a plan's decisions depend on the calibration";
  Calibration other = c;
  other.streams.back().gbps_n = 20;
  EXPECT_NE(other.fingerprint(), c.fingerprint());
  install_host_calibration(std::nullopt);
  EXPECT_EQ(plan_cache_key(*g, PlanTarget{}, ""), before);
}

TEST(Calibration, StoredInTheKernelCacheAndADamagedOrForeignRecordIsNotUsed) {
  char tmpl[] = "/tmp/fj-calibration-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string previous = KernelsCache::instance().dir();
  KernelsCache::use_dir(tmpl);
  const CacheStats before = KernelsCache::instance().stats();
  EXPECT_FALSE(load_calibration());  // none yet
  const Calibration c = example();
  store_calibration(c);
  std::optional<Calibration> back = load_calibration();
  ASSERT_TRUE(back);
  // Reading it counts no hit and no miss: a warm start's counters say what kernels and plans it found.
  const CacheStats after = KernelsCache::instance().stats();
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(back->fingerprint(), c.fingerprint());
  // Well-framed entries whose contents are wrong (the checksum cannot tell): refused, defaults used.
  KernelsCache::instance().put(calibration_key(), "{\"format\": 1, \"machine\": 7}");
  EXPECT_FALSE(load_calibration());
  Calibration foreign = c;
  foreign.machine = "another CPU | 64 cores";
  KernelsCache::instance().put(calibration_key(), calibration_to_json(foreign));
  EXPECT_FALSE(load_calibration());
  KernelsCache::use_dir(previous.empty() ? std::string(tmpl) : previous);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

}  // namespace
}  // namespace fusion_jit
