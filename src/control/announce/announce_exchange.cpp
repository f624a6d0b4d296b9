#include "control/announce/announce_exchange.hpp"

#include <utility>

namespace spillway {

void AnnounceExchange::setInputs(AnnounceControlInputs inputs) {
  std::lock_guard lock(mutex_);
  inputs.stopping = inputs.stopping || inputs_.stopping;  // stopping is for good
  inputs_ = std::move(inputs);
}

void AnnounceExchange::setStopping() {
  std::lock_guard lock(mutex_);
  inputs_.stopping = true;
}

AnnounceOutcome AnnounceExchange::outcome() const {
  std::lock_guard lock(mutex_);
  return outcome_;
}

std::vector<AnnounceTransition> AnnounceExchange::takeTransitions() {
  std::lock_guard lock(mutex_);
  return std::exchange(transitions_, {});
}

AnnounceControlInputs AnnounceExchange::inputs() const {
  std::lock_guard lock(mutex_);
  return inputs_;
}

void AnnounceExchange::publish(AnnounceOutcome outcome,
                               std::vector<AnnounceTransition> transitions) {
  std::lock_guard lock(mutex_);
  outcome_ = std::move(outcome);
  // A control thread that stopped reading must not make this grow for ever:
  // the oldest transitions go first (the outcome stays exact).
  for (auto& t : transitions) {
    if (transitions_.size() >= kMaxPendingTransitions) transitions_.erase(transitions_.begin());
    transitions_.push_back(std::move(t));
  }
}

}  // namespace spillway
