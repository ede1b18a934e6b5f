// cairn_advice: the checkpoint interval from this execution's measured costs
// (docs/design/advise.md, "At run time").
#include "advise/model.hpp"
#include "client/client.hpp"

namespace cairn {

result<cairn_advice_t> client_impl::advice() {
  if (!(cfg_.mtbf > 0))
    return status(errc::invalid_argument,
                  "cairn_advice: the configuration key mtbf (the job's mean time between failures in seconds) is not "
                  "set: set mtbf = SECONDS in the configuration file or CAIRN_MTBF in the environment");
  if (!engine_) return status(errc::invalid_argument, "cairn_advice: the handle has no engine (finalized?)");
  double sum = 0;
  int64_t n = 0;
  for (const auto& [key, rec] : records_) {
    unsigned done = 0, failed = 0;
    bool finished = false;
    if (!rec->job) continue;
    engine_->levels(*rec->job, &done, &failed, &finished);
    // Only versions whose stages all ran, and ran well: their timings are final.
    if (!finished || failed != 0) continue;
    const auto& j = *rec->job;
    double c = j.capture_s + j.checksum_s + j.hash_s + j.local_s;
    // Sync: the application waited for the persistent write too.
    if (cfg_.mode == engine_mode::sync) c += j.persistent_s;
    sum += c;
    ++n;
  }
  if (n == 0)
    return status(errc::again, "cairn_advice: no checkpoint of this execution has finished its stages yet; call it "
                               "after a cairn_wait or a later cairn_checkpoint");
  cairn_advice_t a{};
  a.cost_s = sum / static_cast<double>(n);
  a.mtbf_s = cfg_.mtbf;
  a.checkpoints = n;
  if (!(a.cost_s > 0)) a.cost_s = 1e-9;  // a checkpoint below the clock's resolution: still an answer
  CAIRN_ASSIGN_OR_RETURN(a.young_s, advise::young_interval(a.cost_s, a.mtbf_s));
  CAIRN_ASSIGN_OR_RETURN(a.interval_s, advise::daly_interval(a.cost_s, a.mtbf_s));
  return a;
}

}  // namespace cairn
