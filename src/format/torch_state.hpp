// The keys of a cairn.pytorch state (docs/format/torch_state.md): which
// region of a shard holds which tensor of the saved state dict, so that
// readers (cairn show, the store reader under Python) name `t000004` by its
// key, `model.fc1.weight`. The state itself is written and loaded by
// bindings/python/cairn/pytorch.py; this reads only its structure.
#ifndef CAIRN_FORMAT_TORCH_STATE_HPP
#define CAIRN_FORMAT_TORCH_STATE_HPP

#include <map>
#include <string>
#include <string_view>

#include "cairn/status.hpp"
#include "format/shard_io.hpp"

namespace cairn::format {

inline constexpr const char* kTorchStateRegion = "__cairn_state__";
inline constexpr int kTorchStateFormatVersion = 1;

// Region name -> key of each tensor with a region (at least one element) in
// the state's JSON: the path of keys and list indices from the top, joined
// with '.' ("model.fc1.weight", "optimizer.state.0.exp_avg"). Errors:
// not_supported for another format or a newer format_version, corruption for
// anything else that is not such a state (`where` names it).
result<std::map<std::string, std::string>> torch_state_keys(std::string_view json_text, const std::string& where);

// The same for a shard: read and checksum-verified from its state region;
// empty when the shard has none (not written by cairn.pytorch).
result<std::map<std::string, std::string>> torch_state_keys(shard_reader& shard);

}  // namespace cairn::format

#endif
