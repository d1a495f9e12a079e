// Checkpoints of ferry's samplers: each saves the arguments its orders are a function of, and
// checks them when a state is loaded (a DistributedSampler also resumes at another world size).

#include <typeinfo>

#include <ATen/ATen.h>

#include "ferry/error.h"
#include "ferry/sampler.h"

#include "loader/state_json.h"

namespace ferry {

namespace sj = detail::state_json;
using sj::Json;

namespace {

// The saved state of a ferry sampler of type `type`: a JSON object with that "type".
Json open_state(std::string_view state, const char* type) {
  if (state.empty()) {
    throw ConfigError(
        detail::str("'sampler': the state holds no sampler state, but this loader's "
                    "sampler is a ferry ",
                    type, " sampler; resume with the sampler the state was saved with"));
  }
  Json saved = sj::parse_object(state, "'sampler'");
  const std::string was = sj::get<std::string>(saved, "sampler", "type");
  if (was != type) {
    throw ConfigError(detail::str("'sampler.type': the state was saved with a ", was,
                                  " sampler, but this loader has a ", type,
                                  " sampler; resume with the same sampler"));
  }
  return saved;
}

}  // namespace

std::size_t Sampler::load_state(std::string_view state, std::uint64_t, std::size_t consumed) {
  if (!state.empty()) {
    throw ConfigError(
        detail::str("'sampler': the state holds a sampler's state (", state.substr(0, 60),
                    "), but this loader's sampler (", typeid(*this).name(),
                    ") saves none; resume with the sampler the state was saved with"));
  }
  return consumed;
}

std::string SequentialSampler::state() const {
  return Json{{"type", "sequential"}, {"size", size_}}.dump();
}

std::size_t SequentialSampler::load_state(std::string_view state,
                                          std::uint64_t,
                                          std::size_t consumed) {
  const Json saved = open_state(state, "sequential");
  sj::expect(saved, "sampler", "size", size_);
  return consumed;
}

std::string RandomSampler::state() const {
  Json out{{"type", "random"},          {"data_size", data_size_},
           {"seed", generator_.seed()}, {"replacement", replacement_},
           {"num_samples", nullptr},    {"loader_draw", static_cast<std::uint64_t>(loader_draw_)}};
  if (num_samples_given_) out["num_samples"] = num_samples_;
  return out.dump();
}

std::size_t RandomSampler::load_state(std::string_view state, std::uint64_t, std::size_t consumed) {
  const Json saved = open_state(state, "random");
  sj::expect(saved, "sampler", "data_size", data_size_);
  sj::expect(saved, "sampler", "seed", generator_.seed());
  sj::expect(saved, "sampler", "replacement", replacement_);
  sj::expect(saved, "sampler", "loader_draw", static_cast<std::uint64_t>(loader_draw_));
  const Json given = sj::get<Json>(saved, "sampler", "num_samples");
  const Json now = num_samples_given_ ? Json(num_samples_) : Json(nullptr);
  if (given != now) {
    throw ConfigError(detail::str("'sampler.num_samples': the state was saved with ", given.dump(),
                                  ", but this sampler has ", now.dump(),
                                  "; resume with the same value"));
  }
  return consumed;
}

std::string SubsetRandomSampler::state() const {
  return Json{{"type", "subset_random"},
              {"size", subset_->size()},
              {"seed", generator_.seed()},
              {"subset", sj::fingerprint(subset_->data(), subset_->size() * sizeof(std::int64_t))}}
      .dump();
}

std::size_t SubsetRandomSampler::load_state(std::string_view state,
                                            std::uint64_t,
                                            std::size_t consumed) {
  const Json saved = open_state(state, "subset_random");
  sj::expect(saved, "sampler", "size", subset_->size());
  sj::expect(saved, "sampler", "seed", generator_.seed());
  sj::expect(saved, "sampler", "subset",
             sj::fingerprint(subset_->data(), subset_->size() * sizeof(std::int64_t)));
  return consumed;
}

std::string WeightedRandomSampler::state() const {
  const at::Tensor w = weights_.contiguous();
  return Json{{"type", "weighted_random"},
              {"num_samples", num_samples_},
              {"replacement", replacement_},
              {"seed", generator_.seed()},
              {"weights", sj::fingerprint(w.data_ptr<double>(), w.numel() * sizeof(double))}}
      .dump();
}

std::size_t WeightedRandomSampler::load_state(std::string_view state,
                                              std::uint64_t,
                                              std::size_t consumed) {
  const Json saved = open_state(state, "weighted_random");
  const at::Tensor w = weights_.contiguous();
  sj::expect(saved, "sampler", "num_samples", num_samples_);
  sj::expect(saved, "sampler", "replacement", replacement_);
  sj::expect(saved, "sampler", "seed", generator_.seed());
  sj::expect(saved, "sampler", "weights",
             sj::fingerprint(w.data_ptr<double>(), w.numel() * sizeof(double)));
  return consumed;
}

std::size_t DistributedSampler::size_in_epoch(std::uint64_t epoch) const noexcept {
  if (!split_ || split_->epoch != epoch) return num_samples_;
  const std::size_t rest = split_->end - split_->begin;
  return drop_last_ ? rest / num_replicas_ : (rest + num_replicas_ - 1) / num_replicas_;
}

std::string DistributedSampler::state() const {
  Json out{{"type", "distributed"},  {"data_size", data_size_}, {"num_replicas", num_replicas_},
           {"rank", rank_},          {"shuffle", shuffle_},     {"seed", seed_},
           {"drop_last", drop_last_}};
  if (split_) {
    out["split"] = Json{{"epoch", split_->epoch}, {"begin", split_->begin}, {"end", split_->end}};
  }
  return out.dump();
}

std::size_t DistributedSampler::load_state(std::string_view state,
                                           std::uint64_t epoch,
                                           std::size_t consumed) {
  const Json saved = open_state(state, "distributed");
  sj::expect(saved, "sampler", "data_size", data_size_);
  sj::expect(saved, "sampler", "shuffle", shuffle_);
  sj::expect(saved, "sampler", "seed", seed_);
  sj::expect(saved, "sampler", "drop_last", drop_last_);
  const std::size_t world = sj::get<std::uint64_t>(saved, "sampler", "num_replicas");
  if (world == 0) throw ConfigError("'sampler.num_replicas' is 0; the state is corrupt");
  // The saved world's epoch: its positions [begin, end) of the global order, split among `world`.
  std::size_t begin = 0;
  std::size_t end =
      drop_last_ ? DistributedSampler::per_rank(data_size_, world, true) * world : data_size_;
  std::optional<Split> split;
  if (saved.contains("split")) {
    const Json& s = saved["split"];
    if (!s.is_object()) throw ConfigError("'sampler.split' is not an object");
    Split in{sj::get<std::uint64_t>(s, "sampler.split", "epoch"),
             sj::get<std::uint64_t>(s, "sampler.split", "begin"),
             sj::get<std::uint64_t>(s, "sampler.split", "end")};
    if (in.begin > in.end || in.end > data_size_) {
      throw ConfigError(detail::str("'sampler.split': positions [", in.begin, ", ", in.end,
                                    ") do not fit a dataset of ", data_size_,
                                    "; the state is corrupt"));
    }
    split = in;
  }
  if (world == num_replicas_) {
    split_ = split;  // the same world: the same order, the same position
    return consumed;
  }
  const bool resplit = split && split->epoch == epoch;
  if (consumed == 0 && !resplit) {
    split_.reset();  // nothing of the epoch consumed: PyTorch's split for this world
    return 0;
  }
  if (resplit) {
    begin = split->begin;
    end = split->end;
  }
  // Ranks in step: each consumed `consumed` of its share, so all of them together consumed the
  // first consumed * world positions of [begin, end) (the padding past its end included).
  const std::size_t rest = end - begin;
  const std::size_t share = drop_last_ ? rest / world : (rest + world - 1) / world;
  const std::size_t taken = std::min(consumed, share);
  const std::size_t position = std::min(end, begin + taken * world);
  split_ = Split{epoch, position, end};
  return 0;
}

}  // namespace ferry
