// Cost model: an interface over a device description, and a first roofline estimate.
//
// time = compute + memory - overlap * min(compute, memory) + launches * launch_overhead
// (the shape of XLA's GPU performance model). Estimates rank alternatives; they are not predictions.
#pragma once

#include <cstdint>
#include <string>

namespace fusion_jit {

struct DeviceDescription {
  std::string name;
  double memory_gbps = 44.0;    // streaming bandwidth, measured (DESIGN.md: 2 threads, 44 GB/s)
  double gflops = 50.0;         // scalar-op throughput of the cores together
  double launch_us = 2.0;       // per kernel (CPU: dispatch to the thread pool)
  double overlap = 0.95;
  int cores = 1;
  // The largest row a reduction kernel keeps on chip between its passes (CPU: a core's L2 share; GPU: a
  // block's registers), in bytes of the row's inputs. Longer rows are read from memory once per pass.
  int64_t on_chip_row_bytes = 512 * 1024;
  // Note [Channels-last activations]: what making a CPU graph's convolution activations channels-last
  // gains per element its convolutions write (oneDNN's channels-last kernels write faster), and costs per
  // weight element read and reordered on each call, per weight element copied on each call (not
  // channels-last already), and per element copied at the plan's edges; ns each. Measured on this
  // project's machine (bench/RESULTS.md, "Channels-last activations"); calibration constants, not rules.
  double cl_gain_ns_per_written = 0.75;
  double cl_ns_per_weight = 0.6;
  double cl_ns_per_copied = 0.6;
  double cl_ns_per_edge = 0.3;
  double aten_step_us = 3.0;  // per ATen step on a tiny tensor (the dispatcher and the step's allocation)
  // The calibration these figures come from (Calibration::fingerprint, calibration.h); "" for the defaults.
  std::string calibration{};
};

// The host CPU: the defaults with the core count of this machine, and the figures of the calibration
// installed for this process where there is one (Note [Calibration], calibration.h).
DeviceDescription host_cpu_description();
// The defaults alone (what an uncalibrated machine uses).
DeviceDescription default_host_cpu_description();
// A data-center GPU (H100/H200 class: about 3 TB/s achieved, 50 TFLOP/s fp32, 5 us per launch, 64 KB rows
// in a block's registers), scaled
// to `sm_count` SMs when known (0: 132).
DeviceDescription cuda_gpu_description(int sm_count = 0);

// What a kernel (or an op run alone) does: bytes read and written, arithmetic ops, kernel launches.
struct WorkEstimate {
  int64_t bytes = 0;
  int64_t flops = 0;
  int launches = 0;
  WorkEstimate& operator+=(const WorkEstimate& o) {
    bytes += o.bytes;
    flops += o.flops;
    launches += o.launches;
    return *this;
  }
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual double estimate_us(const WorkEstimate& w) const = 0;
  virtual const DeviceDescription& device() const = 0;
};

class RooflineCostModel : public CostModel {
 public:
  explicit RooflineCostModel(DeviceDescription d) : d_(std::move(d)) {}
  double estimate_us(const WorkEstimate& w) const override;
  const DeviceDescription& device() const override { return d_; }

 private:
  DeviceDescription d_;
};

// What channels-last activations would gain and cost per call on `d` (Note [Channels-last activations]),
// in microseconds: `written` elements written by the convolutions, `weights` weight elements they read
// and reorder on each call, `copied` of those copied on each call, `edges` elements copied at the plan's
// edges. Channels-last pays where gain_us > cost_us.
struct LayoutEstimate {
  double gain_us = 0;
  double cost_us = 0;
};
LayoutEstimate channels_last_estimate(const DeviceDescription& d, int64_t written, int64_t weights, int64_t copied,
                                      int64_t edges);

std::string format_bytes(int64_t bytes);
// One line: the device's name, whether its figures are calibrated (and which calibration) and the figures
// the roofline reads.
std::string describe_device(const DeviceDescription& d);

}  // namespace fusion_jit
