// Step measurements (step_stats.h).
#include "dtorch/train/step_stats.h"

#include <ATen/ATen.h>

#include <sstream>

#include "dtorch/report/metrics.h"

namespace dtorch::train {

void LossTally::add(const at::Tensor& batch_loss, int64_t batch_samples) {
  if (batch_loss.is_cpu()) {
    on_host_ += batch_loss.item<double>();
  } else {
    const at::Tensor l = batch_loss.detach().to(at::kDouble).reshape({});
    on_device_ = on_device_.defined() ? on_device_ + l : l;
  }
  ++batches;
  samples += batch_samples;
}

double LossTally::sum() const {
  return on_host_ + (on_device_.defined() ? on_device_.item<double>() : 0.0);
}

double LossTally::mean() const {
  return sum() / static_cast<double>(std::max<int64_t>(1, batches));
}

LossTally LossTally::resumed(double sum, int64_t batches, int64_t samples) {
  LossTally t;
  t.on_host_ = sum;
  t.batches = batches;
  t.samples = samples;
  return t;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median_seconds(std::vector<double> seconds) {
  if (seconds.empty()) return 0;
  const auto middle = seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2);
  std::nth_element(seconds.begin(), middle, seconds.end());
  if (seconds.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(seconds.begin(), middle)) / 2;
}

std::string describe_phases(const std::map<std::string, double>& ms) {
  std::ostringstream os;
  os.precision(3);
  for (const char* phase : report::kStepPhases)
    if (auto it = ms.find(phase); it != ms.end()) os << ", " << phase << " " << it->second << " ms";
  return os.str();
}

}  // namespace dtorch::train
