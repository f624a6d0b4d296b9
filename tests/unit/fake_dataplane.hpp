// A Dataplane (spillway/dataplane.hpp) for control-plane tests without EAL:
// it keeps what is published, applies it at once (or when told), and answers
// flow counts, exception exports and VIP syncs from what the test sets.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spillway/dataplane.hpp"

namespace spillway::test {

class FakeDataplane final : public Dataplane {
 public:
  void publish(std::unique_ptr<const ForwardingSnapshot> snapshot) override {
    latest = std::shared_ptr<const ForwardingSnapshot>(std::move(snapshot));
    ++publishes;
    if (onPublish) onPublish(*latest);
    if (applyAtOnce) applied = latest->generation;
  }
  std::size_t reclaim() override { return 0; }
  [[nodiscard]] std::uint64_t publishedGeneration() const override {
    return latest ? latest->generation : 0;
  }
  [[nodiscard]] std::uint64_t appliedGeneration() const override { return applied; }

  void requestFlowCounts(std::uint64_t n) override { flowCountAsked = n; }
  [[nodiscard]] std::optional<std::vector<LcoreFlowCounts>> collectFlowCounts(
      std::uint64_t n) override {
    if (n != flowCountAsked || !answerFlowCounts) return std::nullopt;
    return flowCounts;
  }

  void requestExceptionExport(std::uint64_t n, const ForwardingSnapshot* next) override {
    exportAsked = n;
    exportAskedAhead = next != nullptr;
    exportNext = next;
    if (next != nullptr) {
      ++exportsAhead;
      lastExportNext = next;
    }
  }
  void forgetExportNext() override {
    exportNext = nullptr;
    ++forgets;
  }
  [[nodiscard]] std::optional<std::vector<ExportedFlow>> collectExceptionExport(
      std::uint64_t n) override {
    if (n != exportAsked || !answerExports) return std::nullopt;
    if (!exportAskedAhead) return exportFlows;
    std::vector<ExportedFlow> all = exportFlows;
    all.insert(all.end(), aheadFlows.begin(), aheadFlows.end());
    return all;
  }

  void requestPurge(std::uint64_t n, const std::vector<std::uint32_t>& indices) override {
    purgeAsked = n;
    purgeRequests.push_back(indices);
  }
  [[nodiscard]] bool purgeDone(std::uint64_t n) const override {
    return answerPurges && n <= purgeAsked;
  }

  [[nodiscard]] std::optional<std::string> syncVips(std::span<const VipKey> vips) override {
    if (vipSyncError) return vipSyncError;
    vipSyncs.emplace_back(vips.begin(), vips.end());
    return std::nullopt;
  }
  [[nodiscard]] DataplaneCounters counters() const override { return stats; }
  [[nodiscard]] std::uint64_t placedOffTable() const override { return stats.placedOffTable; }
  void backendBytes(std::span<std::uint64_t> out) const override {
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = i < stats.backendBytes.size() ? stats.backendBytes[i] : 0;
    }
  }
  [[nodiscard]] std::vector<std::uint64_t> workerRounds() const override { return rounds; }
  [[nodiscard]] std::vector<LcoreAdoptedFlow> adoptedFlows() const override { return adopted; }

  // As new (a restarted process's data path).
  void reset() {
    latest.reset();
    publishes = 0;
    applyAtOnce = true;
    applied = 0;
    flowCountAsked = 0;
    answerFlowCounts = true;
    flowCounts.clear();
    exportAsked = 0;
    exportAskedAhead = false;
    aheadFlows.clear();
    exportNext = nullptr;
    lastExportNext = nullptr;
    exportsAhead = 0;
    forgets = 0;
    answerExports = true;
    exportFlows.clear();
    vipSyncError.reset();
    purgeAsked = 0;
    answerPurges = true;
    purgeRequests.clear();
    vipSyncs.clear();
    stats = DataplaneCounters{};
    rounds.clear();
    adopted.clear();
  }

  // What the test sets and reads.
  std::shared_ptr<const ForwardingSnapshot> latest;
  std::uint64_t publishes = 0;
  std::function<void(const ForwardingSnapshot&)> onPublish;  // before it is applied
  bool applyAtOnce = true;
  std::uint64_t applied = 0;
  std::uint64_t flowCountAsked = 0;
  bool answerFlowCounts = true;
  std::vector<LcoreFlowCounts> flowCounts;
  std::uint64_t exportAsked = 0;
  bool exportAskedAhead = false;
  // Flows only a next snapshot makes exceptions: answered to requests with one.
  std::vector<ExportedFlow> aheadFlows;
  const ForwardingSnapshot* exportNext = nullptr;      // of the last request, until forgotten
  const ForwardingSnapshot* lastExportNext = nullptr;  // the last one given, never cleared
  std::uint64_t exportsAhead = 0;                      // requests that came with a next snapshot
  std::uint64_t forgets = 0;
  bool answerExports = true;
  std::vector<ExportedFlow> exportFlows;
  std::uint64_t purgeAsked = 0;
  bool answerPurges = true;
  std::vector<std::vector<std::uint32_t>> purgeRequests;
  std::optional<std::string> vipSyncError;
  std::vector<std::vector<VipKey>> vipSyncs;
  DataplaneCounters stats;
  std::vector<std::uint64_t> rounds;
  std::vector<LcoreAdoptedFlow> adopted;
};

}  // namespace spillway::test
