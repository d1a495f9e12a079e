// Checkpoints of ferry's samplers: each saves the arguments its orders are a function of, and
// checks them when a state is loaded (a DistributedSampler also resumes at another world size).

#include <typeinfo>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

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

// A snapshot is the Mersenne Twister's fields, little-endian: seed (8 bytes), left (4), seeded
// (1), next (4), then the 624 words of its state (4 each).
constexpr std::size_t kSnapshotBytes = 8 + 4 + 1 + 4 + 624 * 4;

template <class T>
void put(std::vector<unsigned char>& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(value) >> (8 * i)));
  }
}

template <class T>
T take(const std::vector<unsigned char>& in, std::size_t& at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= std::uint64_t{in[at + i]} << (8 * i);
  at += sizeof(T);
  return static_cast<T>(value);
}

// The sampler's generator at the start of its last epoch drawn, if it has one to give.
void save_generator(Json& out, const EpochGenerator& generator) {
  if (auto snapshot = generator.snapshot()) {
    out["generator"] = Json{{"epoch", snapshot->first}, {"mt19937", std::move(snapshot->second)}};
  }
}

void load_generator(const Json& saved, EpochGenerator& generator) {
  if (!saved.contains("generator")) {  // a sampler that had drawn nothing: from the seed
    generator.restore(0, "");
    return;
  }
  const Json& g = saved["generator"];
  if (!g.is_object()) throw ConfigError("'sampler.generator' is not an object");
  generator.restore(sj::get<std::uint64_t>(g, "sampler.generator", "epoch"),
                    sj::get<std::string>(g, "sampler.generator", "mt19937"));
}

}  // namespace

std::optional<std::pair<std::uint64_t, std::string>> EpochGenerator::snapshot() const {
  if (!start_) return std::nullopt;
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(*start_);
  // ferry's samplers draw no normals; a generator caching one cannot be saved this way.
  if (impl->next_float_normal_sample() || impl->next_double_normal_sample()) return std::nullopt;
  const at::mt19937_data_pod pod = impl->engine().data();
  std::vector<unsigned char> bytes;
  bytes.reserve(kSnapshotBytes);
  put(bytes, pod.seed_);
  put(bytes, static_cast<std::uint32_t>(pod.left_));
  put(bytes, static_cast<std::uint8_t>(pod.seeded_));
  put(bytes, pod.next_);
  for (const std::uint32_t word : pod.state_) put(bytes, word);
  return std::make_pair(start_epoch_, sj::base64_encode(bytes));
}

void EpochGenerator::restore(std::uint64_t epoch, std::string_view text) {
  if (text.empty()) {  // back to the seed: epochs are drawn from the start again
    generator_.reset();
    start_.reset();
    next_epoch_ = start_epoch_ = 0;
    finish_pending_ = false;
    return;
  }
  const auto bytes = sj::base64_decode(text);
  if (!bytes || bytes->size() != kSnapshotBytes) {
    throw ConfigError(detail::str("'sampler.generator.mt19937' is not a generator's state (",
                                  bytes ? bytes->size() : 0, " bytes, not ", kSnapshotBytes,
                                  "); the state is cut short or edited"));
  }
  at::mt19937_data_pod pod{};
  std::size_t at = 0;
  pod.seed_ = take<std::uint64_t>(*bytes, at);
  pod.left_ = static_cast<int>(take<std::uint32_t>(*bytes, at));
  pod.seeded_ = take<std::uint8_t>(*bytes, at) != 0;
  pod.next_ = take<std::uint32_t>(*bytes, at);
  for (std::uint32_t& word : pod.state_) word = take<std::uint32_t>(*bytes, at);
  if (pod.seed_ != seed_ || pod.left_ < 1 || pod.left_ > 625 || pod.next_ > 624) {
    throw ConfigError(
        detail::str("'sampler.generator': not a state of this sampler's generator "
                    "(seed ",
                    pod.seed_, ", this sampler's ", seed_, ")"));
  }
  at::Generator generator = at::detail::createCPUGenerator(seed_);
  at::mt19937 engine;
  engine.set_data(pod);
  at::check_generator<at::CPUGeneratorImpl>(generator)->set_engine(engine);
  generator_ = generator;
  next_epoch_ = epoch;
  finish_pending_ = false;
  start_ = generator.clone();
  start_epoch_ = epoch;
}

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
  save_generator(out, generator_);
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
  load_generator(saved, generator_);
  return consumed;
}

std::string SubsetRandomSampler::state() const {
  Json out{{"type", "subset_random"},
           {"size", subset_->size()},
           {"seed", generator_.seed()},
           {"subset", sj::fingerprint(subset_->data(), subset_->size() * sizeof(std::int64_t))}};
  save_generator(out, generator_);
  return out.dump();
}

std::size_t SubsetRandomSampler::load_state(std::string_view state,
                                            std::uint64_t,
                                            std::size_t consumed) {
  const Json saved = open_state(state, "subset_random");
  sj::expect(saved, "sampler", "size", subset_->size());
  sj::expect(saved, "sampler", "seed", generator_.seed());
  sj::expect(saved, "sampler", "subset",
             sj::fingerprint(subset_->data(), subset_->size() * sizeof(std::int64_t)));
  load_generator(saved, generator_);
  return consumed;
}

std::string WeightedRandomSampler::state() const {
  const at::Tensor w = weights_.contiguous();
  Json out{{"type", "weighted_random"},
           {"num_samples", num_samples_},
           {"replacement", replacement_},
           {"seed", generator_.seed()},
           {"weights", sj::fingerprint(w.data_ptr<double>(), w.numel() * sizeof(double))}};
  save_generator(out, generator_);
  return out.dump();
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
  load_generator(saved, generator_);
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
