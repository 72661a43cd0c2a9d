// Ahead-of-time packages: one file that a server loads and runs with no capture, no passes, no compiler, no
// TorchScript interpreter and no cache directory.
//
//   fusion_jit::package(module, {{x}, {x_long}}, "model.fjpkg");   // or: fusion-jit package model.pt ...
//   auto served = fusion_jit::load_package("model.fjpkg");          // milliseconds; nothing on disk
//   c10::IValue out = served({x});                                   // the packaged plan of x's signature
//
// A package holds, per input signature given when it was built, the plan (the optimized graph, the fusion
// plan and its kernels' launch data), the constants after folding (the module's weights), and the explain
// text; and, per generated source, its compiled code in each variant asked for (Note [Packaged binaries]
// in codegen/target.h: for the CPU, -march=native code for the machine it was built on and portable
// x86-64-v2 code for any other; for CUDA, a CUBIN per architecture and PTX). Its manifest names the package
// format, the fusion_jit version and build it was made by, the torch version, the device its plans run on,
// and the signatures it serves. The file is one archive (Note [Package
// archives], support/archive.h): checksummed, written to a temporary file and renamed.
//
// A package holds native code that loading runs (a CPU image is dlopened: its ELF constructors run then), so
// an unsigned package is trusted code, as a shared library is. With a package key configured
// (PackageOptions::key_file, LoadOptions::key_file, else FUSION_JIT_PACKAGE_KEY: a key file checked as the
// remote cache's is) packages are signed when built (HMAC-SHA256 over every section) and verified when
// loaded before anything of them is read, and an unsigned package, or one whose signature does not verify,
// is refused (Note [Package signatures] in torch/package.cpp). Signed or not, the manifest, graphs, plans,
// kernel names and constants are checked before any of the package's code is loaded.
//
// Loading refuses, with an error naming the path and what is wrong: with a key configured, an unsigned
// package or a signature that does not verify (another key, or a change after signing), or a key file that
// fails its check; another package format, another fusion_jit build or torch version, a truncated or
// altered file, a malformed manifest, graph, plan or kernel name, code this machine cannot run (native
// code for another CPU and no portable variant it supports), plans that call oneDNN on bfloat16 where this
// CPU's oneDNN does not take it. A call whose inputs match no packaged
// signature raises an error naming the signature it got and those the package has (or, given a fallback,
// runs it).
//
// Plans are built with the module's CompileOptions, the oneDNN and MKL rules included, except that the
// steps that reorder a weight into the layout of this CPU's oneDNN or MKL kernels are not folded: the
// package stores the plain weight and runs each such step once when it loads, on the CPU that serves
// (Note [Prepacked weights]; LoadedPackage::prepack_ms). A CUDA package (PackageOptions::device) is refused, naming
// why, on a machine with no usable GPU, or whose GPU none of its CUBINs nor its PTX runs on.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusion_jit/fusion_jit.h"

namespace fusion_jit {

struct PackageOptions {
  CompileOptions compile;  // the module's options (disable, enable_fusion, dynamic)
  // The compiled variants of the CPU code, most specific first; default: "native", "x86-64-v2". Each is
  // "native" or an x86-64 level ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4").
  std::vector<std::string> cpu_variants;
  // Where the plans run: "cpu", or "cuda" (cuda:0 of the loading machine, inputs and outputs on it). A CUDA
  // package is built from CPU inputs with no GPU needed, as CompiledModule::compile_cuda builds its plan
  // (no oneDNN rules, no channels-last plans); its signatures are those inputs' on cuda:0.
  std::string device = "cpu";
  // For "cuda": the architectures to compile CUBINs for ("sm_80", "sm_90", ...; default both); PTX for the
  // newest is added, which the driver compiles for newer GPUs, unless a "compute_XY" is listed.
  std::vector<std::string> cuda_archs;
  // The key file to sign the package with (Note [Package signatures]); "" = FUSION_JIT_PACKAGE_KEY's, and
  // where that is unset too the package is not signed. A key file that fails its check (read_key_file:
  // ownership, mode 600, length) is an error, and nothing is written.
  std::string key_file;
};

struct PackageInfo {
  std::string path;
  int64_t bytes = 0;
  int signatures = 0;
  int kernels = 0;           // over all signatures
  int sources = 0;           // distinct generated sources (signatures may share one)
  int64_t constant_bytes = 0;  // the constants' storages, each counted once
  double build_ms = 0;
  std::string key_file;        // the key file it was signed with; "" = not signed
};

// Builds the package of `module` for each input list of `signatures` (each is run once, as the JIT's first
// call is) and writes it to `path`. Throws fusion_jit::Error naming what is wrong (an input on a GPU, a
// signature given twice, a signature that cannot be captured and why, a compile that failed); `path` is
// then left as it was.
PackageInfo package(const torch::jit::Module& module, const std::vector<std::vector<c10::IValue>>& signatures,
                    const std::string& path, const PackageOptions& options = {});

// One signature of a graph given in the IR's text form, as the torch.compile backend lowers an FX graph
// (Python's fusion_jit.package lowers an nn.Module's exported graph so): its tensor inputs (CPU), the IR
// text, and the tensors its fj::constant nodes name (the weights).
struct GraphSignature {
  std::vector<at::Tensor> inputs;
  std::string ir;
  std::vector<at::Tensor> constants;
};

// Builds the package of graphs given as IR text, one per signature, named `name`; their plans return a
// list of tensors. Options, errors and the file as package() above.
PackageInfo package_graphs(const std::string& name, const std::vector<GraphSignature>& signatures,
                           const std::string& path, const PackageOptions& options = {});

struct LoadOptions {
  // Runs the calls whose signature the package lacks (for instance a fusion_jit::compile of the module);
  // default: such a call throws fusion_jit::Error.
  std::function<c10::IValue(const std::vector<c10::IValue>&)> fallback;
  // The key file to verify the package's signature with (Note [Package signatures]); "" =
  // FUSION_JIT_PACKAGE_KEY's. With a key, an unsigned package, one whose signature does not verify, and a
  // key file that fails its check are refused before anything of the package is read; with none, a
  // package's signature is not checked and the package is trusted as a shared library is.
  std::string key_file;
};

class LoadedPackage {
 public:
  c10::IValue operator()(const std::vector<c10::IValue>& inputs) const;
  // The packaged signatures, one line each ("f32[2,16,64]{...}, ...").
  std::vector<std::string> signatures() const;
  // The manifest (versions, targets, the code variant loaded) and each signature's plan as explain gives it.
  std::string explain() const;
  // Where its plans run and take their inputs: "cpu" or "cuda" (cuda:0).
  const std::string& device() const;
  // The key file its signature was verified with; "" when no key was configured (explain says whether the
  // package was signed).
  const std::string& verified_with() const;
  double load_ms() const;         // reading, checking and loading, constants included
  double constants_ms() const;    // of which reading the constants (weights) and prepacking them
  double prepack_ms() const;      // of which prepacking (oneDNN's and MKL's weight layouts for this CPU)
  int64_t fallback_calls() const;

  struct Impl;
  explicit LoadedPackage(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

// Loads a package; throws fusion_jit::Error naming the path and why it is refused.
LoadedPackage load_package(const std::string& path, LoadOptions options = {});

}  // namespace fusion_jit
