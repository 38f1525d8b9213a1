// recserve's Triton backend (`backend: "recserve"`): serves the export's native TorchScript graph, the
// `recommender_native` contract (item_ids INT64 (B, L), k INT32 (B, 1), exclude_seen BOOL (B, 1) in;
// item IDs INT64, scores FP32, unknown_ids INT32 out, in the config's order).
//
// On a GPU instance the graph is captured at load, after warm-up, as one CUDA graph per batch-size bucket
// (parameter `buckets`, default 1, 2, 4, ... up to max_batch_size), all on the instance's stream and
// memory pool. An execution copies its requests' rows into the smallest bucket that holds them (the rest
// of the bucket: empty histories), replays that graph, and sends each request its rows. On a CPU instance
// the same graph runs as it is, on exactly the rows asked for. A request whose inputs do not fit the
// contract gets its own error; the others in its batch are answered.
//
// Parameters (config.pbtxt): buckets ("1,2,4,..."), padding_id (the histories' padding, default -1),
// intra_op_thread_count (CPU threads of an instance, default 1), warmup (calls before a capture, default 3).
//
// By session (parameter session_store: the store's record, JSON; history_length: the graph's width): the
// `recommender_native_session` contract, session_id BYTES (B, 1), item_ids INT64 (B, -1) optional (items to
// append to the row's session first; -1 is padding), event_ids BYTES (B, -1) optional (the client's ID of each
// item, "" for none: an event sent again with its ID is stored once), k, exclude_seen in; item IDs, scores
// (k wide), unknown_ids, history_source INT32 (0 the store, 1 the request's items alone), history_length INT32 out. One
// round trip to the store a batch (session_store.h) appends every row's items and reads every session's
// newest items; the rows' histories are staged as the graph takes them and scored in the same execution.
// A store that fails answers the requests that brought items from those alone, and refuses the others
// with UNAVAILABLE.
//
// The floor (parameter floor "true", the `floor` layout): the recommender_native contract answered without a
// graph: the requests read and staged as above, and each answered max_k IDs of -1, scores 0 and unknown_ids
// 0, batched as the native model is. What a request costs the server, Triton and this backend, with no model
// in it: the native model's figures over the floor's are the model's own cost on any host.
//
// Events alone (parameters session_store and events_only "true": the `events` contract of the session layout,
// integer IDs): session_id BYTES (B, 1), item_ids INT64 (B, -1) (padded with -1), event_ids BYTES (B, -1)
// optional in; stored INT32 (B, 1) out, how many of a row's items the store acknowledged. No graph: one round
// trip a batch appends every row's items (as by session, nothing read), on a KIND_CPU instance.
//
// Business rules (parameter rules_file: the rule bank `recserve repo` compiles, rules.pt): three more
// optional inputs after the others, rule BYTES (rows, 1) (a rule stored by name), exclude_item_ids and
// include_item_ids INT64 (rows, items) (padded with -1). The stored rules' masks live on the device; each
// row's mask and listed items are staged beside its history, and a batch with a rule in it runs the graph's
// `ruled` method (captured too, for lists of up to kListed items). Where the model reads a store (by session,
// or parameter hidden_store: the store's record), the items hidden catalogue-wide (`recserve items hide`)
// are masked as well: each batch reads their version (by session in the sessions' round trip), and the items
// only when it moved, so a hide the store acknowledged holds for every batch that starts after it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#ifdef TRITON_ENABLE_GPU
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "session_store.h"
#include "triton/backend/backend_common.h"
#include "triton/backend/backend_model.h"
#include "triton/backend/backend_model_instance.h"
#include "triton/core/tritonbackend.h"

namespace triton { namespace backend { namespace recserve {

namespace {

constexpr int kInputs = 3;
constexpr int kOutputs = 3;
const TRITONSERVER_DataType kInputTypes[kInputs] = {
    TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_INT32, TRITONSERVER_TYPE_BOOL};
const TRITONSERVER_DataType kOutputTypes[kOutputs] = {
    TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_FP32, TRITONSERVER_TYPE_INT32};
const at::ScalarType kInputScalars[kInputs] = {at::kLong, at::kInt, at::kBool};
const at::ScalarType kOutputScalars[kOutputs] = {at::kLong, at::kFloat, at::kInt};
// by session: session_id, item_ids (optional), event_ids (optional), k, exclude_seen in; the graph's outputs,
// history_source and history_length out
constexpr int kSessionInputs = 5;
constexpr int kSessionOutputs = 5;
const TRITONSERVER_DataType kSessionInputTypes[kSessionInputs] = {
    TRITONSERVER_TYPE_BYTES, TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_BYTES, TRITONSERVER_TYPE_INT32,
    TRITONSERVER_TYPE_BOOL};
constexpr int kSessionFirstGraphInput = 3;  // k: the first of the inputs the graph takes as they come
// events alone: session_id, item_ids, event_ids (optional) in; stored out
constexpr int kEventsInputs = 3;
const TRITONSERVER_DataType kEventsInputTypes[kEventsInputs] = {
    TRITONSERVER_TYPE_BYTES, TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_BYTES};
const TRITONSERVER_DataType kEventsOutputTypes[1] = {TRITONSERVER_TYPE_INT32};
const TRITONSERVER_DataType kSessionOutputTypes[kSessionOutputs] = {
    TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_FP32, TRITONSERVER_TYPE_INT32, TRITONSERVER_TYPE_INT32,
    TRITONSERVER_TYPE_INT32};
constexpr int64_t kMaxAppended = 4096;  // items a row may append in one request
// business rules: rule, exclude_item_ids, include_item_ids after the other inputs
constexpr int kRuleInputs = 3;
const TRITONSERVER_DataType kRuleInputTypes[kRuleInputs] = {
    TRITONSERVER_TYPE_BYTES, TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_INT64};
constexpr int64_t kMaxRuleItems = 1024;  // excluded, or included, items of a request (constants.MAX_RULE_ITEMS)
constexpr double kHiddenRetryS = 0.5;  // after a failed read of the hidden items, the next try at the soonest
constexpr double kHiddenWholeS = 1.0;  // with no version to follow, the whole set read at most this often
                                       // (hidden_items.WHOLE_READ_S)
constexpr int64_t kListed = 128;  // listed items a row may bring to a captured graph (more: it runs uncaptured)

TRITONSERVER_Error*
Error(const std::string& message, TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INVALID_ARG)
{
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

// An integer parameter of the model config, or `fallback` where it is not set.
TRITONSERVER_Error*
IntParameter(common::TritonJson::Value& config, const std::string& key, int64_t fallback, int64_t* value)
{
  *value = fallback;
  common::TritonJson::Value params;
  if (!config.Find("parameters", &params)) {
    return nullptr;
  }
  std::string text;
  TRITONSERVER_Error* err = GetParameterValue(params, key, &text);
  if (err != nullptr) {
    TRITONSERVER_ErrorDelete(err);
    return nullptr;
  }
  try {
    size_t used = 0;
    *value = std::stoll(text, &used);
    if (used != text.size()) {
      throw std::invalid_argument(text);
    }
  }
  catch (const std::exception&) {
    return Error("parameter " + key + ": '" + text + "' is not an integer");
  }
  return nullptr;
}

// A string parameter of the model config, or "" where it is not set.
std::string
StringParameter(common::TritonJson::Value& config, const std::string& key)
{
  std::string text;
  common::TritonJson::Value params;
  if (config.Find("parameters", &params)) {
    TRITONSERVER_Error* err = GetParameterValue(params, key, &text);
    if (err != nullptr) {
      TRITONSERVER_ErrorDelete(err);
      text.clear();
    }
  }
  return text;
}

// The rules a repository stores by name, compiled when it was written (rules.pt, a TorchScript module of
// attributes: recserve's layouts/native.py), and the catalogue's IDs to map listed and hidden items with.
struct RuleBank {
  std::vector<int64_t> item_ids;  // sorted: item_ids[i] has the vocabulary index i + 1
  std::vector<std::string> names;  // the mask of names[r] is row r + 1; row 0 lets every item through
  at::Tensor masks;  // (1 + names, items + 2) bool by vocabulary index, on the host

  // The table Index reads: open addressing over a power of two at least twice the catalogue. A request's
  // listed IDs each cost one or two cache lines, where a binary search over 1M IDs (8 MB) costs about 20
  // dependent reads (0.3 us an ID on one core, 100 IDs a row).
  void IndexIds()
  {
    size_t capacity = 2;
    while (capacity < 2 * item_ids.size()) {
      capacity *= 2;
    }
    slot_ids_.assign(capacity, 0);
    slot_index_.assign(capacity, 0);
    for (size_t i = 0; i < item_ids.size(); ++i) {
      size_t slot = Home(item_ids[i]);
      while (slot_index_[slot] != 0) {
        slot = (slot + 1) & (capacity - 1);
      }
      slot_ids_[slot] = item_ids[i];
      slot_index_[slot] = static_cast<int64_t>(i) + 1;
    }
  }
  // The vocabulary index of an item ID, 0 where the catalogue does not hold it.
  int64_t Index(int64_t id) const
  {
    if (slot_ids_.empty()) {  // a bank not read (no rules_file): it holds no item
      return 0;
    }
    size_t slot = Home(id);
    while (slot_index_[slot] != 0 && slot_ids_[slot] != id) {
      slot = (slot + 1) & (slot_ids_.size() - 1);
    }
    return slot_index_[slot];  // an empty slot's 0 where the ID is not there
  }
  // The mask row of a stored rule, -1 where none has that name.
  int64_t Row(const std::string& name) const
  {
    const auto found = std::find(names.begin(), names.end(), name);
    return found == names.end() ? -1 : (found - names.begin()) + 1;
  }
  std::string Stored() const
  {
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    std::string text;
    for (const std::string& name : sorted) {
      text += (text.empty() ? "" : ", ") + name;
    }
    return text.empty() ? "none (recserve repo --rules FILE stores them)" : text;
  }

 private:
  // An ID's first slot (Fibonacci hashing): the high bits of its product with 2^64 / phi, as many as the table needs.
  size_t Home(int64_t id) const
  {
    const int bits = __builtin_ctzll(slot_ids_.size());
    return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
  }
  std::vector<int64_t> slot_ids_;
  std::vector<int64_t> slot_index_;  // 0: an empty slot
};

}  // namespace

// The model: its contract (names and types checked against the recommender_native contract), its
// parameters and the TorchScript file every instance loads.
class ModelState : public BackendModel {
 public:
  static TRITONSERVER_Error* Create(TRITONBACKEND_Model* triton_model, ModelState** state);

  const std::string& InputName(int i) const { return inputs_[i]; }
  const std::string& OutputName(int i) const { return outputs_[i]; }
  int64_t HistoryLength() const { return history_length_; }
  int64_t PaddingId() const { return padding_id_; }
  int64_t IntraOpThreads() const { return intra_op_threads_; }
  int64_t Warmup() const { return warmup_; }
  int64_t StepSummaryS() const { return step_summary_s_; }  // 0: no summary of the batches' steps
  const std::vector<int64_t>& Buckets() const { return buckets_; }
  bool BySession() const { return by_session_; }
  bool EventsOnly() const { return events_only_; }  // appends alone, no graph (by session too)
  bool Floor() const { return floor_; }  // answers without a graph (the recommender_native contract)
  int64_t MaxK() const { return max_k_; }
  const StoreSettings& Store() const { return store_; }
  bool Rules() const { return rules_; }
  const RuleBank& Bank() const { return bank_; }
  int RuleInput() const { return by_session_ ? kSessionInputs : kInputs; }  // the first rule input's place
  // Where the hidden items are read (by session the sessions' store): null where none are.
  const StoreSettings* HiddenStore() const
  {
    return !rules_ ? nullptr : by_session_ ? &store_ : hidden_store_.url.empty() ? nullptr : &hidden_store_;
  }
  std::string ModelPath(const std::string& artifact) const
  {
    return RepositoryPath() + "/" + std::to_string(Version()) + "/" + (artifact.empty() ? "model.pt" : artifact);
  }

 private:
  // optional inputs allowed: by session, item_ids and event_ids
  explicit ModelState(TRITONBACKEND_Model* triton_model) : BackendModel(triton_model, true) {}
  TRITONSERVER_Error* ReadContract();
  TRITONSERVER_Error* ReadParameters();
  TRITONSERVER_Error* ReadRules();

  std::string inputs_[kSessionInputs + kRuleInputs];
  std::string outputs_[kSessionOutputs];
  bool by_session_ = false;
  bool events_only_ = false;
  bool floor_ = false;
  StoreSettings store_;
  bool rules_ = false;
  RuleBank bank_;
  StoreSettings hidden_store_;
  int64_t max_k_ = 0;
  int64_t history_length_ = 0;
  int64_t padding_id_ = -1;
  int64_t intra_op_threads_ = 1;
  int64_t warmup_ = 3;
  int64_t step_summary_s_ = 0;
  std::vector<int64_t> buckets_;
};

TRITONSERVER_Error*
ModelState::Create(TRITONBACKEND_Model* triton_model, ModelState** state)
{
  try {
    *state = new ModelState(triton_model);
  }
  catch (const BackendModelException& ex) {
    return ex.err_ != nullptr ? ex.err_ : Error("the model config could not be read", TRITONSERVER_ERROR_INTERNAL);
  }
  TRITONSERVER_Error* err = (*state)->ReadContract();
  if (err == nullptr) {
    err = (*state)->ReadParameters();
  }
  if (err == nullptr && (*state)->rules_) {
    err = (*state)->ReadRules();
  }
  if (err != nullptr) {
    delete *state;
    *state = nullptr;
  }
  return err;
}

TRITONSERVER_Error*
ModelState::ReadContract()
{
  if (MaxBatchSize() <= 0) {
    return Error("the recserve backend batches requests: set max_batch_size above 0");
  }
  const std::string record = StringParameter(ModelConfig(), "session_store");
  by_session_ = !record.empty();
  events_only_ = StringParameter(ModelConfig(), "events_only") == "true";
  if (events_only_ && !by_session_) {
    return Error("parameter events_only needs the parameter session_store (the store the events go to)");
  }
  if (by_session_) {
    const std::string problem = ParseStoreRecord(record, &store_);
    if (!problem.empty()) {
      return Error(problem);
    }
  }
  if (by_session_ && !events_only_) {
    int64_t length = 0;
    RETURN_IF_ERROR(IntParameter(ModelConfig(), "history_length", 0, &length));
    if (length < 1) {
      return Error("by session the recserve backend needs the parameter history_length (the graph's width)");
    }
    history_length_ = length;
  }
  rules_ = !StringParameter(ModelConfig(), "rules_file").empty();
  if (events_only_ && rules_) {
    return Error("an events-only model takes no rules: it answers no recommendations");
  }
  floor_ = StringParameter(ModelConfig(), "floor") == "true";
  if (floor_ && (by_session_ || rules_)) {
    return Error("parameter floor answers the recommender_native contract alone: no session_store, no rules_file");
  }
  const char* contract = events_only_ ? "events" : by_session_ ? "recommender_native_session" : "recommender_native";
  const char* kinds[2] = {"input", "output"};
  const TRITONSERVER_DataType* types[2] = {
      events_only_ ? kEventsInputTypes : by_session_ ? kSessionInputTypes : kInputTypes,
      events_only_ ? kEventsOutputTypes : by_session_ ? kSessionOutputTypes : kOutputTypes};
  const size_t counts[2] = {
      size_t(events_only_ ? kEventsInputs : (by_session_ ? kSessionInputs : kInputs) + (rules_ ? kRuleInputs : 0)),
      size_t(events_only_ ? 1 : by_session_ ? kSessionOutputs : kOutputs)};
  const size_t rule_input = events_only_ ? kEventsInputs : by_session_ ? kSessionInputs : kInputs;
  std::string* names[2] = {inputs_, outputs_};
  for (int side = 0; side < 2; ++side) {
    common::TritonJson::Value tensors;
    RETURN_IF_ERROR(ModelConfig().MemberAsArray(kinds[side], &tensors));
    if (tensors.ArraySize() != counts[side]) {
      return Error(
          std::string("the recserve backend serves the ") + contract + " contract: " + std::to_string(counts[side]) +
          " " + kinds[side] + "s, not " + std::to_string(tensors.ArraySize()));
    }
    for (size_t i = 0; i < counts[side]; ++i) {
      common::TritonJson::Value tensor;
      RETURN_IF_ERROR(tensors.IndexAsObject(i, &tensor));
      RETURN_IF_ERROR(tensor.MemberAsString("name", &names[side][i]));
      std::string type;
      RETURN_IF_ERROR(tensor.MemberAsString("data_type", &type));
      const bool rule = side == 0 && i >= rule_input;  // a business rule's input (rules_file)
      const TRITONSERVER_DataType want = rule ? kRuleInputTypes[i - rule_input] : types[side][i];
      if (ModelConfigDataTypeToTritonServerDataType(type) != want) {
        return Error(
            std::string(kinds[side]) + " " + std::to_string(i) + " ('" + names[side][i] + "') is " + type + "; the " +
            contract + " contract has " + TRITONSERVER_DataTypeString(want) + " there");
      }
      // by session, item_ids and event_ids are as wide as a request's
      if (side == 0 && !rule && !(by_session_ && (i == 1 || i == 2))) {
        std::vector<int64_t> dims;
        RETURN_IF_ERROR(ParseShape(tensor, "dims", &dims));
        const bool history = !by_session_ && i == 0;
        if (dims.size() != 1 || dims[0] <= 0 || (!history && dims[0] != 1)) {
          return Error(
              "input '" + names[side][i] + "' needs one fixed dimension (the padded history; 1 for the others)");
        }
        if (history) {
          history_length_ = dims[0];
        }
      }
    }
  }
  return nullptr;
}

TRITONSERVER_Error*
ModelState::ReadParameters()
{
  RETURN_IF_ERROR(IntParameter(ModelConfig(), "padding_id", -1, &padding_id_));
  RETURN_IF_ERROR(IntParameter(ModelConfig(), "intra_op_thread_count", 1, &intra_op_threads_));
  RETURN_IF_ERROR(IntParameter(ModelConfig(), "warmup", 3, &warmup_));
  RETURN_IF_ERROR(IntParameter(ModelConfig(), "step_summary_s", 0, &step_summary_s_));
  RETURN_IF_ERROR(IntParameter(ModelConfig(), "max_k", INT32_MAX, &max_k_));
  const std::string text = StringParameter(ModelConfig(), "buckets");
  const int64_t max_batch = MaxBatchSize();
  if (text.empty()) {
    for (int64_t b = 1; b < max_batch; b *= 2) {
      buckets_.push_back(b);
    }
  } else {
    std::stringstream items(text);
    std::string item;
    while (std::getline(items, item, ',')) {
      try {
        size_t used = 0;
        const int64_t b = std::stoll(item, &used);
        if (b <= 0 || b > max_batch || used != item.size()) {
          throw std::invalid_argument(item);
        }
        buckets_.push_back(b);
      }
      catch (const std::exception&) {
        return Error("parameter buckets: '" + item + "' is not a batch size in 1.." + std::to_string(max_batch));
      }
    }
  }
  buckets_.push_back(max_batch);  // every batch the batcher forms fits a bucket
  std::sort(buckets_.begin(), buckets_.end());
  buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
  if (intra_op_threads_ < 1 || warmup_ < 1) {
    return Error("parameters intra_op_thread_count and warmup must be at least 1");
  }
  const std::string hidden = StringParameter(ModelConfig(), "hidden_store");
  if (!hidden.empty()) {
    const std::string problem = ParseStoreRecord(hidden, &hidden_store_);
    if (!problem.empty()) {
      return Error("parameter hidden_store: " + problem);
    }
  }
  return nullptr;
}

TRITONSERVER_Error*
ModelState::ReadRules()
{
  const std::string path = ModelPath(StringParameter(ModelConfig(), "rules_file"));
  try {
    torch::jit::Module file = torch::jit::load(path, at::kCPU);
    at::Tensor ids = file.attr("item_ids").toTensor().to(at::kLong).contiguous();
    bank_.item_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
    for (const c10::IValue& name : file.attr("names").toListRef()) {
      bank_.names.push_back(name.toStringRef());
    }
    bank_.masks = file.attr("masks").toTensor().to(at::kBool).contiguous();
  }
  catch (const std::exception& ex) {
    return Error("reading the rule bank " + path + ": " + ex.what());
  }
  const int64_t items = static_cast<int64_t>(bank_.item_ids.size());
  if (bank_.masks.dim() != 2 || bank_.masks.size(0) != int64_t(bank_.names.size()) + 1 ||
      bank_.masks.size(1) != items + 2 || !std::is_sorted(bank_.item_ids.begin(), bank_.item_ids.end())) {
    return Error("the rule bank " + path + " does not fit its catalogue: write the repository again (recserve repo)");
  }
  bank_.IndexIds();
  return nullptr;
}

// The steps of a batch, timed: its requests read and staged, the store's round trips (sessions, hidden items:
// commands sent, replies awaited and decoded by hiredis), the sessions' replies parsed into item IDs and copied
// into the batch's rows, the graph's inputs copied, the graph run (on a GPU: replayed and waited for), the
// answers sent.
enum BatchStep { kStepRequests, kStepStore, kStepParse, kStepInputs, kStepGraph, kStepAnswers, kBatchSteps };
const char* const kBatchStepNames[kBatchSteps] = {"requests", "store", "parse", "inputs", "graph", "answers"};
// Each batch's time in each step, summarised in the log every `period_s` seconds (parameter step_summary_s; 0:
// never, nothing kept): the median, the 99th percentile and the largest of each step, so that what makes the
// slow batches slow shows (Triton's own statistics give means of three steps).
class StepClock {
 public:
  explicit StepClock(int64_t period_s = 0) : period_s_(period_s) {}
  bool On() const { return period_s_ > 0; }
  void Start()  // a batch begins (off: nothing timed, so the hot path reads no clock)
  {
    if (!On()) {
      return;
    }
    started_ = last_ = Now();
    std::fill(spent_, spent_ + kBatchSteps, 0.0);
  }
  void Mark(BatchStep step)  // the time since the last mark, added to `step`
  {
    if (!On()) {
      return;
    }
    const double now = Now();
    spent_[step] += now - last_;
    last_ = now;
  }
  void Move(BatchStep from, BatchStep to, double seconds)  // time a step's mark took in that was another's
  {
    if (!On()) {
      return;
    }
    spent_[from] -= seconds;
    spent_[to] += seconds;
  }
  // The batch's times kept; a summary line after the first batch and once a period has passed, "" otherwise.
  std::string EndBatch(bool ruled)
  {
    const double now = Now();
    const bool first = period_start_ < 0;
    if (first) {
      period_start_ = started_;
    }
    for (int step = 0; step < kBatchSteps; ++step) {
      times_[step].push_back(static_cast<float>(spent_[step] * 1e3));
    }
    ruled_ += ruled;
    if (!first && now - period_start_ < period_s_) {
      return "";
    }
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(3);
    line << "batches " << times_[0].size() << " in " << (now - period_start_) << " s, under rules " << ruled_
         << "; ms a batch, p50/p99/max:";
    for (int step = 0; step < kBatchSteps; ++step) {
      std::vector<float>& t = times_[step];
      std::sort(t.begin(), t.end());
      line << (step ? ", " : " ") << kBatchStepNames[step] << " " << t[t.size() / 2] << "/"
           << t[std::min(t.size() - 1, t.size() * 99 / 100)] << "/" << t.back();
      t.clear();
    }
    period_start_ = now;
    ruled_ = 0;
    return line.str();
  }

 private:
  static double Now() { return Monotonic(); }
  int64_t period_s_;
  double started_ = 0, last_ = 0, period_start_ = -1;
  double spent_[kBatchSteps] = {};
  std::vector<float> times_[kBatchSteps];
  int64_t ruled_ = 0;
};

// One request's place in an execution.
struct Slot {
  uint32_t index;  // in the execution's requests
  TRITONBACKEND_Request* request;
  TRITONBACKEND_Response* response;
  int64_t first_row;
  int64_t rows;
  int64_t width = 0;  // by session: the answers' width (the request's largest k); 0: the graph's
  std::string unavailable = "";  // by session: the store's problem where the request cannot be answered
};

// An execution's times as Triton's statistics take them: its start, its compute's start and end, its end.
struct ExecTimes {
  uint64_t start = 0, compute_start = 0, compute_end = 0, end = 0;
};

// A request's rows by session: their session IDs, the items to append to each first and the client's ID of
// each item ("" where it has none: the store gives it one of the batch's).
struct SessionRows {
  std::vector<std::string> sessions;
  std::vector<std::vector<int64_t>> events;
  std::vector<std::vector<std::string>> event_ids;
};

// One instance: the loaded graph on its device; on a GPU its captured graphs and their static tensors.
class ModelInstanceState : public BackendModelInstance {
 public:
  static TRITONSERVER_Error* Create(
      ModelState* model_state, TRITONBACKEND_ModelInstance* triton_instance, ModelInstanceState** state);
  void Execute(TRITONBACKEND_Request** requests, uint32_t request_count);

 private:
  ModelInstanceState(ModelState* model_state, TRITONBACKEND_ModelInstance* triton_instance)
      : BackendModelInstance(model_state, triton_instance), model_(model_state), clock_(model_state->StepSummaryS())
  {
  }
  TRITONSERVER_Error* Load();
  TRITONSERVER_Error* Stage(TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows);
  // By session and events alone: the request's session IDs, items and their event IDs into `found` (the items
  // required where `items_required`).
  TRITONSERVER_Error* StageAppends(
      TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows, SessionRows* found, bool items_required);
  // Events alone: every request's rows appended in one round trip, each answered how many the store took.
  void ExecuteEvents(TRITONBACKEND_Request** requests, uint32_t request_count);
  // Every request staged as the model takes it into `slots` (a request refused is answered its error there),
  // its session rows into `batch`; returns the rows staged.
  int64_t StageRequests(
      TRITONBACKEND_Request** requests, uint32_t request_count, std::vector<Slot>* slots, SessionRows* batch);
  // Every request's statistics reported (and the batch's, where it had rows) and the requests released.
  void Release(
      TRITONBACKEND_Request** requests, uint32_t request_count, const std::vector<bool>& succeeded,
      const ExecTimes& times, int64_t rows);
  // By session: the request's session IDs and items into `found`, its k and exclude_seen staged.
  TRITONSERVER_Error* StageSession(
      TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows, int64_t* width, SessionRows* found);
  // By session: the store's histories of the batch staged as the graph takes them (slots it fails marked).
  void StageHistories(const SessionRows& batch, std::vector<Slot>* slots);
  // Business rules: the request's rows' mask and listed items staged (rows [first_row, first_row + rows)).
  TRITONSERVER_Error* StageRules(TRITONBACKEND_Request* request, int64_t first_row, int64_t rows);
  // The hidden items brought to the store's (`version`: by session, as the sessions' round trip read it; -1
  // without sessions: the reply of SendHiddenVersion's GET where one was sent, else a GET now). True where the
  // masks changed.
  bool RefreshHidden(int64_t version);
  // Without sessions: the hidden items' version asked for now (SessionStore::SendVersion), so that the store
  // answers while the batch's graph runs. False where no store is there to ask, a failed read's pause lasts,
  // or the store could not be asked (its problem said as a failed read's is).
  bool SendHiddenVersion();
  // A read of the hidden items failed: the items read last stay hidden; said once a problem (again every
  // minute it lasts), and the next try made after a pause, not on every batch.
  void HiddenProblem(const std::string& problem, double clock);
  // A read of the hidden items failed lately and its pause lasts: no store is asked before it ends.
  bool HiddenPaused(double clock) const { return !hidden_problem_.empty() && clock < hidden_retry_at_; }
  TRITONSERVER_Error* Respond(const Slot& slot);
  // Runs rows [0, rows) of the staged inputs (under their rules where `ruled`); the answers land in outputs_
  // (host tensors).
  void Run(int64_t rows, bool ruled);
  // The rows' rules as the graph's `ruled` takes them after the bank: mask_of_row (rows), excluded and
  // included (rows, width), on the host (pinned where `pinned`).
  std::vector<at::Tensor> RuleTensors(int64_t rows, int64_t width) const;
  // The rows' rules written into `rules` (mask_of_row (rows), excluded and included (rows, width)), which hold
  // zeros past them: what RuleTensors and StageRuleTensors both stage.
  void WriteRules(int64_t rows, int64_t width, const at::Tensor (&rules)[kRuleInputs]) const;
#ifdef TRITON_ENABLE_GPU
  void StageRuleTensors(int64_t rows);  // this batch's rules into rule_staged_, what the last batch left cleared
  // The staged rows [rows, bucket): empty histories asking for one item, which a captured bucket runs beside
  // the batch's (their answers are never read).
  void PadStagedRows(int64_t rows, int64_t bucket);
#endif
  std::vector<at::Tensor> Forward(const std::vector<at::Tensor>& inputs, bool ruled = false);

  ModelState* model_;
  StepClock clock_;  // each batch's steps, for the log's summary (parameter step_summary_s)
  torch::jit::Module module_;
  at::Device device_ = at::kCPU;
  at::Tensor staged_[kInputs];  // host (pinned on GPUs), max_batch_size rows
  at::Tensor outputs_[kOutputs];  // host answers of the last Run
  at::Tensor floor_[kOutputs];  // the floor's answers (parameter floor), made at load, max_batch_size x max_k
  std::unique_ptr<SessionStore> store_;  // by session
  at::Tensor session_out_[2];  // by session: history_source and history_length, max_batch_size rows
  // business rules: each staged row's mask (its stored rule's row, 0 for none) and listed items (vocabulary
  // indices: excluded, included); whether a row of the batch has any, and its longest list
  std::vector<int64_t> mask_of_row_;
  std::vector<std::vector<int64_t>> listed_[2];
  bool ruled_ = false;
  int64_t widest_ = 0;
  // the stored masks, the items not hidden, and the masks the graph reads (their product), on the device
  at::Tensor named_, visible_, bank_;
  std::unique_ptr<SessionStore> hidden_store_;  // where hidden items are read without sessions
  int64_t hidden_version_ = -1;  // -1: never read
  std::string hidden_entry_;  // the store's last change that visible_host_ holds ("": read the whole set next)
  at::Tensor visible_host_;  // the items not hidden, on the host: what visible_ copies
  int64_t hidden_count_ = 0;
  std::string hidden_problem_;  // the last read's problem ("" once the items were read)
  double hidden_retry_at_ = 0, hidden_logged_at_ = 0, hidden_whole_at_ = -1e18;  // steady-clock seconds
#ifdef TRITON_ENABLE_GPU
  struct Captured {
    int64_t batch;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor inputs[kInputs + kRuleInputs];  // device, static (the rules' only where ruled)
    std::vector<at::Tensor> outputs;  // device, static
  };
  TRITONSERVER_Error* Capture();
  TRITONSERVER_Error* CaptureOne(int64_t batch, bool ruled, const at::cuda::MempoolId_t& pool, Captured* c);
  std::vector<Captured> captured_, captured_ruled_;
  std::unique_ptr<c10::cuda::CUDAStream> capture_stream_;
  at::Tensor host_out_[kOutputs];  // pinned, max_batch_size rows
  // under rules, pinned: each row's mask (max_batch_size), its excluded and its included items (max_batch_size,
  // kListed); zero past the rows a batch wrote, so that a bucket's copy brings its empty rows no rule
  at::Tensor rule_staged_[kRuleInputs];
  int64_t rule_rows_written_ = 0;
#endif
};

TRITONSERVER_Error*
ModelInstanceState::Create(
    ModelState* model_state, TRITONBACKEND_ModelInstance* triton_instance, ModelInstanceState** state)
{
  try {
    *state = new ModelInstanceState(model_state, triton_instance);
  }
  catch (const BackendModelInstanceException& ex) {
    return ex.err_ != nullptr ? ex.err_ : Error("the instance could not be made", TRITONSERVER_ERROR_INTERNAL);
  }
  TRITONSERVER_Error* err = (*state)->Load();
  if (err != nullptr) {
    delete *state;
    *state = nullptr;
  }
  return err;
}

std::vector<at::Tensor>
ModelInstanceState::Forward(const std::vector<at::Tensor>& inputs, bool ruled)
{
  // as Triton's PyTorch backend runs a model with DISABLE_OPTIMIZED_EXECUTION: no profiling executor
  // re-optimising the graph for each new batch size
  torch::jit::GraphOptimizerEnabledGuard no_optimizer(false);
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  if (ruled) {
    args.insert(args.begin() + kInputs, bank_);  // the masks, before each row's
  }
  c10::IValue result = ruled ? module_.get_method("ruled")(args) : module_.forward(args);
  if (!result.isTuple() || result.toTupleRef().elements().size() != kOutputs) {
    throw std::runtime_error("the graph must return 3 tensors (item IDs, scores, unknown_ids)");
  }
  std::vector<at::Tensor> out;
  for (int i = 0; i < kOutputs; ++i) {
    at::Tensor t = result.toTupleRef().elements()[i].toTensor();
    out.push_back(t.scalar_type() == kOutputScalars[i] ? t : t.to(kOutputScalars[i]));
  }
  return out;
}

TRITONSERVER_Error*
ModelInstanceState::Load()
{
  const int64_t max_batch = model_->MaxBatchSize();
  const bool gpu = Kind() == TRITONSERVER_INSTANCEGROUPKIND_GPU;
#ifndef TRITON_ENABLE_GPU
  if (gpu) {
    return Error(
        "this recserve backend was built without CUDA: rebuild it on the GPU host "
        "(rm -rf build/triton-backends && scripts/build_triton_backends.sh)");
  }
#endif
  if (!gpu && Kind() != TRITONSERVER_INSTANCEGROUPKIND_CPU) {
    return Error("the recserve backend runs KIND_CPU or KIND_GPU instances");
  }
  if (model_->EventsOnly()) {  // the store alone: no graph, nothing on a device
    store_ = std::make_unique<SessionStore>(model_->Store());
    return nullptr;
  }
  if (model_->Floor()) {  // the requests staged as the graph would take them; the answers made once
    if (model_->MaxK() < 1 || model_->MaxK() > 100000) {
      return Error("parameter floor needs the parameter max_k (1..100000): the answers' width");
    }
    const int64_t widths[kInputs] = {model_->HistoryLength(), 1, 1};
    for (int i = 0; i < kInputs; ++i) {
      staged_[i] = at::empty({max_batch, widths[i]}, at::TensorOptions().dtype(kInputScalars[i]));
    }
    floor_[0] = at::full({max_batch, model_->MaxK()}, model_->PaddingId(), at::TensorOptions().dtype(at::kLong));
    floor_[1] = at::zeros({max_batch, model_->MaxK()}, at::TensorOptions().dtype(at::kFloat));
    floor_[2] = at::zeros({max_batch, 1}, at::TensorOptions().dtype(at::kInt));
    return nullptr;
  }
  const std::string path = model_->ModelPath(ArtifactFilename());
  try {
    device_ = gpu ? at::Device(at::kCUDA, DeviceId()) : at::Device(at::kCPU);
    module_ = torch::jit::load(path, device_);
    module_.eval();
    const auto pinned = at::TensorOptions().pinned_memory(gpu);
    const int64_t widths[kInputs] = {model_->HistoryLength(), 1, 1};
    for (int i = 0; i < kInputs; ++i) {
      staged_[i] = at::empty({max_batch, widths[i]}, pinned.dtype(kInputScalars[i]));
    }
    if (model_->BySession()) {
      store_ = std::make_unique<SessionStore>(model_->Store());
      for (at::Tensor& out : session_out_) {
        out = at::zeros({max_batch, 1}, at::TensorOptions().dtype(at::kInt));
      }
    }
    if (model_->Rules()) {
      if (module_.find_method("ruled") == c10::nullopt) {
        throw std::runtime_error("the graph has no ruled method: export it again (recserve export)");
      }
      mask_of_row_.assign(max_batch, 0);
      listed_[0].assign(max_batch, {});
      listed_[1].assign(max_batch, {});
      named_ = model_->Bank().masks.to(device_);
      visible_ = at::ones({named_.size(1)}, at::TensorOptions(device_).dtype(at::kBool));
      visible_host_ = at::ones({named_.size(1)}, at::TensorOptions().dtype(at::kBool));
      bank_ = named_.clone();
      if (!model_->BySession() && model_->HiddenStore() != nullptr) {
        hidden_store_ = std::make_unique<SessionStore>(*model_->HiddenStore());
      }
    }
  }
  catch (const std::exception& ex) {
    return Error("loading " + path + " on " + (gpu ? "cuda:" + std::to_string(DeviceId()) : std::string("cpu")) +
                 ": " + ex.what());
  }
#ifdef TRITON_ENABLE_GPU
  if (gpu) {
    return Capture();
  }
#endif
  return nullptr;
}

#ifdef TRITON_ENABLE_GPU
TRITONSERVER_Error*
ModelInstanceState::CaptureOne(int64_t batch, bool ruled, const at::cuda::MempoolId_t& pool, Captured* c)
{
  c->batch = batch;
  try {
    const auto on_device = at::TensorOptions(device_);
    c->inputs[0] = at::full({batch, model_->HistoryLength()}, model_->PaddingId(), on_device.dtype(at::kLong));
    c->inputs[1] = at::ones({batch, 1}, on_device.dtype(at::kInt));
    c->inputs[2] = at::zeros({batch, 1}, on_device.dtype(at::kBool));
    std::vector<at::Tensor> inputs(c->inputs, c->inputs + kInputs);
    if (ruled) {  // every row: no rule of its own, no listed item
      c->inputs[3] = at::zeros({batch}, on_device.dtype(at::kLong));
      c->inputs[4] = at::zeros({batch, kListed}, on_device.dtype(at::kLong));
      c->inputs[5] = at::zeros({batch, kListed}, on_device.dtype(at::kLong));
      inputs.assign(c->inputs, c->inputs + kInputs + kRuleInputs);
    }
    for (int64_t i = 0; i < model_->Warmup(); ++i) {
      Forward(inputs, ruled);
    }
    capture_stream_->synchronize();
    c->graph = std::make_unique<at::cuda::CUDAGraph>();
    // thread-local: other instances load (and allocate) on other threads meanwhile
    c->graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    c->outputs = Forward(inputs, ruled);
    c->graph->capture_end();
    c->graph->replay();
    capture_stream_->synchronize();
  }
  catch (const std::exception& ex) {
    return Error(
        std::string("capturing the CUDA graph") + (ruled ? " under rules" : "") + " of batch size " +
            std::to_string(batch) + " on cuda:" + std::to_string(device_.index()) + " failed: " + ex.what() +
            " (set the parameter buckets to the sizes that capture, or serve with --native-runtime pytorch)",
        TRITONSERVER_ERROR_INTERNAL);
  }
  const std::vector<Captured>& before = captured_.empty() ? captured_ruled_ : captured_;
  if (!before.empty() && c->outputs[0].size(1) != before.front().outputs[0].size(1)) {
    return Error(
        "the graph answers " + std::to_string(c->outputs[0].size(1)) + " items wide at batch size " +
            std::to_string(batch) + " and " + std::to_string(before.front().outputs[0].size(1)) + " at " +
            std::to_string(before.front().batch) + ": replayed graphs need one width (export with --device cuda: "
            "max_k wide)",
        TRITONSERVER_ERROR_INTERNAL);
  }
  return nullptr;
}

TRITONSERVER_Error*
ModelInstanceState::Capture()
{
  c10::cuda::CUDAGuard device_guard(device_);
  capture_stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_.index()));
  c10::cuda::CUDAStreamGuard capture_stream_guard(*capture_stream_);
  c10::InferenceMode inference;
  const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
  for (int64_t batch : model_->Buckets()) {
    for (bool ruled : {false, true}) {
      if (ruled && !model_->Rules()) {
        continue;
      }
      Captured c;
      RETURN_IF_ERROR(CaptureOne(batch, ruled, pool, &c));
      (ruled ? captured_ruled_ : captured_).push_back(std::move(c));
    }
  }
  for (int i = 0; i < kOutputs; ++i) {
    const at::Tensor& out = captured_.back().outputs[i];
    host_out_[i] = at::empty({model_->MaxBatchSize(), out.size(1)}, out.options().device(at::kCPU).pinned_memory(true));
  }
  if (model_->Rules()) {
    const auto pinned = at::TensorOptions().dtype(at::kLong).pinned_memory(true);
    rule_staged_[0] = at::zeros({model_->MaxBatchSize()}, pinned);
    rule_staged_[1] = at::zeros({model_->MaxBatchSize(), kListed}, pinned);
    rule_staged_[2] = at::zeros({model_->MaxBatchSize(), kListed}, pinned);
  }
  LOG_MESSAGE(
      TRITONSERVER_LOG_INFO,
      (std::string("recserve backend: ") + Name() + " captured " +
       std::to_string(captured_.size() + captured_ruled_.size()) + " CUDA graphs (batch sizes up to " +
       std::to_string(model_->MaxBatchSize()) + (model_->Rules() ? ", each also under rules)" : ")"))
          .c_str());
  return nullptr;
}
#endif

namespace {

// A request's input: its type, shape and size (`input` null where an optional one is absent).
struct InputView {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_DataType type = TRITONSERVER_TYPE_INVALID;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  uint32_t buffers = 0;
};

TRITONSERVER_Error*
ViewInput(TRITONBACKEND_Request* request, const std::string& name, bool optional, InputView* view)
{
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, name.c_str(), &view->input);
  if (err != nullptr) {
    view->input = nullptr;
    if (optional) {
      TRITONSERVER_ErrorDelete(err);
      return nullptr;
    }
    return err;
  }
  const int64_t* shape;
  uint32_t dims;
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(
      view->input, nullptr, &view->type, &shape, &dims, &view->bytes, &view->buffers));
  view->shape.assign(shape, shape + dims);
  return nullptr;
}

// Copies an input's buffers (host or GPU memory) to `target`, which holds exactly its bytes.
TRITONSERVER_Error*
Gather(const InputView& view, const std::string& name, char* target)
{
  uint64_t copied = 0;
  for (uint32_t b = 0; b < view.buffers; ++b) {
    const void* data;
    uint64_t size;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(view.input, b, &data, &size, &memory, &memory_id));
    if (copied + size > view.bytes) {
      return Error("input '" + name + "' holds more bytes than its shape");
    }
    if (memory == TRITONSERVER_MEMORY_GPU) {
#ifdef TRITON_ENABLE_GPU
      if (cudaMemcpy(target + copied, data, size, cudaMemcpyDeviceToHost) != cudaSuccess) {
        return Error("input '" + name + "': copying it from GPU memory failed", TRITONSERVER_ERROR_INTERNAL);
      }
#else
      return Error("input '" + name + "' is in GPU memory, which a CPU build of the recserve backend cannot read");
#endif
    } else {
      std::memcpy(target + copied, data, size);
    }
    copied += size;
  }
  if (copied != view.bytes) {
    return Error("input '" + name + "' holds fewer bytes than its shape");
  }
  return nullptr;
}

// A BYTES input's first `count` elements (each its length, 4 bytes little-endian, then its bytes) into `out`.
TRITONSERVER_Error*
GatherStrings(const InputView& view, const std::string& name, int64_t count, std::vector<std::string>* out)
{
  std::string text(view.bytes, '\0');
  RETURN_IF_ERROR(Gather(view, name, text.data()));
  size_t at = 0;
  for (int64_t r = 0; r < count; ++r) {
    uint32_t length = 0;
    if (at + 4 > text.size() || (std::memcpy(&length, text.data() + at, 4), at + 4 + length > text.size())) {
      return Error("input '" + name + "': malformed BYTES");
    }
    out->emplace_back(text.data() + at + 4, length);
    at += 4 + length;
  }
  return nullptr;
}

// The client's event IDs of a request's items (`name`, optional: `out` left empty where absent): BYTES of the
// items' shape, each "" (no ID: the store gives one) or 1 to 64 letters, digits or '._:-'
// (store_contract.event_problem), as the python models take them.
TRITONSERVER_Error*
GatherEventIds(
    TRITONBACKEND_Request* request, const std::string& name, const std::vector<int64_t>& shape,
    std::vector<std::string>* out)
{
  InputView view;
  RETURN_IF_ERROR(ViewInput(request, name, true, &view));
  if (view.input == nullptr) {
    return nullptr;
  }
  if (view.type != TRITONSERVER_TYPE_BYTES || view.shape != shape) {
    return Error(
        name + ": BYTES of item_ids' shape [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + "]");
  }
  RETURN_IF_ERROR(GatherStrings(view, name, shape[0] * shape[1], out));
  for (const std::string& id : *out) {
    const bool allowed = std::all_of(id.begin(), id.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-';
    });
    if (id.size() > 64 || !allowed) {
      return Error(name + ": 1 to 64 letters, digits or '._:-', got '" + id.substr(0, 80) + "'");
    }
  }
  return nullptr;
}

}  // namespace

TRITONSERVER_Error*
ModelInstanceState::Stage(TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows)
{
  *rows = -1;
  for (int i = 0; i < kInputs; ++i) {
    const std::string& name = model_->InputName(i);
    InputView view;
    RETURN_IF_ERROR(ViewInput(request, name, false, &view));
    const int64_t width = staged_[i].size(1);
    if (view.type != kInputTypes[i] || view.shape.size() != 2 || view.shape[1] != width || view.shape[0] < 1 ||
        (*rows >= 0 && view.shape[0] != *rows)) {
      return Error(
          "input '" + name + "': expected " + TRITONSERVER_DataTypeString(kInputTypes[i]) + " [rows, " +
          std::to_string(width) + "] with the same rows as the other inputs");
    }
    *rows = view.shape[0];
    if (first_row + *rows > staged_[i].size(0)) {
      return Error("the batch holds more than max_batch_size rows");
    }
    RETURN_IF_ERROR(Gather(
        view, name, static_cast<char*>(staged_[i].data_ptr()) + first_row * width * staged_[i].element_size()));
  }
  return model_->Rules() ? StageRules(request, first_row, *rows) : nullptr;
}

TRITONSERVER_Error*
ModelInstanceState::StageAppends(
    TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows, SessionRows* found, bool items_required)
{
  InputView sessions;
  const std::string& session_name = model_->InputName(0);
  RETURN_IF_ERROR(ViewInput(request, session_name, false, &sessions));
  if (sessions.type != TRITONSERVER_TYPE_BYTES || sessions.shape.size() != 2 || sessions.shape[1] != 1 ||
      sessions.shape[0] < 1) {
    return Error("input '" + session_name + "': expected BYTES [rows, 1] (one session ID a row)");
  }
  *rows = sessions.shape[0];
  if (first_row + *rows > model_->MaxBatchSize()) {
    return Error("the batch holds more than max_batch_size rows");
  }
  RETURN_IF_ERROR(GatherStrings(sessions, session_name, *rows, &found->sessions));
  for (const std::string& session : found->sessions) {
    const std::string problem = SessionIdProblem(session);
    if (!problem.empty()) {
      return Error("input '" + session_name + "': " + problem);
    }
  }
  InputView items;
  const std::string& items_name = model_->InputName(1);
  RETURN_IF_ERROR(ViewInput(request, items_name, !items_required, &items));
  found->events.assign(*rows, {});
  found->event_ids.assign(*rows, {});
  if (items.input != nullptr) {
    if (items.type != TRITONSERVER_TYPE_INT64 || items.shape.size() != 2 || items.shape[0] != *rows ||
        items.shape[1] > kMaxAppended) {
      return Error(
          "input '" + items_name + "': expected INT64 [rows, items] with a row a session, at most " +
          std::to_string(kMaxAppended) + " items (padded with -1)");
    }
    std::vector<int64_t> ids(items.bytes / sizeof(int64_t));
    RETURN_IF_ERROR(Gather(items, items_name, reinterpret_cast<char*>(ids.data())));
    std::vector<std::string> event_ids;
    RETURN_IF_ERROR(GatherEventIds(request, model_->InputName(2), items.shape, &event_ids));
    for (int64_t r = 0; r < *rows; ++r) {
      for (int64_t c = 0; c < items.shape[1]; ++c) {
        const int64_t id = ids[r * items.shape[1] + c];
        if (id != model_->PaddingId()) {
          found->events[r].push_back(id);
          found->event_ids[r].push_back(event_ids.empty() ? std::string() : event_ids[r * items.shape[1] + c]);
        }
      }
    }
  } else {
    InputView event_ids;  // IDs of no items: refused, as the python models refuse them
    RETURN_IF_ERROR(ViewInput(request, model_->InputName(2), true, &event_ids));
    if (event_ids.input != nullptr) {
      return Error(
          "input '" + model_->InputName(2) + "': the IDs of the events in " + items_name + ", which is absent");
    }
  }
  return nullptr;
}

TRITONSERVER_Error*
ModelInstanceState::StageSession(
    TRITONBACKEND_Request* request, int64_t first_row, int64_t* rows, int64_t* width, SessionRows* found)
{
  RETURN_IF_ERROR(StageAppends(request, first_row, rows, found, false));
  for (int i = 1; i < kInputs; ++i) {  // k and exclude_seen, as the graph takes them
    const std::string& name = model_->InputName(kSessionFirstGraphInput + i - 1);
    InputView view;
    RETURN_IF_ERROR(ViewInput(request, name, false, &view));
    if (view.type != kInputTypes[i] || view.shape.size() != 2 || view.shape[0] != *rows || view.shape[1] != 1) {
      return Error(
          "input '" + name + "': expected " + TRITONSERVER_DataTypeString(kInputTypes[i]) + " [rows, 1], a row a session");
    }
    RETURN_IF_ERROR(Gather(view, name, static_cast<char*>(staged_[i].data_ptr()) + first_row * staged_[i].element_size()));
  }
  *width = 1;
  const int32_t* ks = staged_[1].data_ptr<int32_t>() + first_row;
  for (int64_t r = 0; r < *rows; ++r) {
    if (ks[r] < 1 || ks[r] > model_->MaxK()) {
      return Error(
          "input '" + model_->InputName(kSessionFirstGraphInput) + "': k out of range (1.." +
          std::to_string(model_->MaxK()) + ")");
    }
    *width = std::max<int64_t>(*width, ks[r]);
  }
  return model_->Rules() ? StageRules(request, first_row, *rows) : nullptr;
}

TRITONSERVER_Error*
ModelInstanceState::StageRules(TRITONBACKEND_Request* request, int64_t first_row, int64_t rows)
{
  const RuleBank& bank = model_->Bank();
  const int first = model_->RuleInput();
  std::vector<int64_t> mask_of_row(rows, 0);
  std::vector<std::vector<int64_t>> listed[2] = {std::vector<std::vector<int64_t>>(rows), std::vector<std::vector<int64_t>>(rows)};
  InputView rule;
  const std::string& rule_name = model_->InputName(first);
  RETURN_IF_ERROR(ViewInput(request, rule_name, true, &rule));
  if (rule.input != nullptr) {
    if (rule.type != TRITONSERVER_TYPE_BYTES || rule.shape.size() != 2 || rule.shape[0] != rows || rule.shape[1] != 1) {
      return Error("input '" + rule_name + "': expected BYTES [rows, 1] (a stored rule's name a row)");
    }
    std::vector<std::string> names;
    RETURN_IF_ERROR(GatherStrings(rule, rule_name, rows, &names));
    for (int64_t r = 0; r < rows; ++r) {
      if (!names[r].empty()) {
        mask_of_row[r] = bank.Row(names[r]);
        if (mask_of_row[r] < 0) {
          return Error(rule_name + ": no rule named '" + names[r] + "'; the repository stores " + bank.Stored());
        }
      }
    }
  }
  // the mask token's index: no rule allows it, so a list of unknown items alone keeps its row to nothing
  const int64_t never = static_cast<int64_t>(bank.item_ids.size()) + 1;
  for (int side = 0; side < 2; ++side) {
    InputView view;
    const std::string& name = model_->InputName(first + 1 + side);
    RETURN_IF_ERROR(ViewInput(request, name, true, &view));
    if (view.input == nullptr) {
      continue;
    }
    if (view.type != TRITONSERVER_TYPE_INT64 || view.shape.size() != 2 || view.shape[0] != rows) {
      return Error("input '" + name + "': expected INT64 [rows, items] (item IDs, padded with -1)");
    }
    if (view.shape[1] > kMaxRuleItems) {
      return Error(name + ": " + std::to_string(view.shape[1]) + " items; at most " + std::to_string(kMaxRuleItems));
    }
    std::vector<int64_t> ids(view.bytes / sizeof(int64_t));
    RETURN_IF_ERROR(Gather(view, name, reinterpret_cast<char*>(ids.data())));
    for (int64_t r = 0; r < rows; ++r) {
      bool any = false;
      for (int64_t c = 0; c < view.shape[1]; ++c) {
        const int64_t id = ids[r * view.shape[1] + c];
        if (id == model_->PaddingId()) {
          continue;
        }
        any = true;
        const int64_t index = bank.Index(id);
        if (index > 0) {
          listed[side][r].push_back(index);
        }
      }
      if (side == 1 && any && listed[side][r].empty()) {
        listed[side][r].push_back(never);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // staged only now: a refused request leaves no trace in the batch
    mask_of_row_[first_row + r] = mask_of_row[r];
    for (int side = 0; side < 2; ++side) {
      widest_ = std::max<int64_t>(widest_, listed[side][r].size());
      ruled_ = ruled_ || mask_of_row[r] != 0 || !listed[side][r].empty();
      listed_[side][first_row + r] = std::move(listed[side][r]);
    }
  }
  return nullptr;
}

void
ModelInstanceState::HiddenProblem(const std::string& problem, double clock)
{
  if (problem != hidden_problem_ || clock >= hidden_logged_at_ + 60) {
    LOG_MESSAGE(TRITONSERVER_LOG_WARN, ("recserve backend: the hidden items were not read: " + problem).c_str());
    hidden_logged_at_ = clock;
  }
  hidden_problem_ = problem;
  hidden_retry_at_ = clock + kHiddenRetryS;
}

bool
ModelInstanceState::SendHiddenVersion()
{
  const double clock = Monotonic();
  if (hidden_store_ == nullptr || HiddenPaused(clock)) {
    return false;
  }
  const std::string problem = hidden_store_->SendVersion();
  if (!problem.empty()) {
    HiddenProblem(problem, clock);
    return false;
  }
  return true;
}

bool
ModelInstanceState::RefreshHidden(int64_t version)
{
  SessionStore* store = model_->BySession() ? store_.get() : hidden_store_.get();
  const double clock = Monotonic();
  // no version to follow (none in the store, or not a count: read as 0): the whole set every kHiddenWholeS
  const bool whole_due = hidden_version_ <= 0 && clock >= hidden_whole_at_ + kHiddenWholeS;
  if (store == nullptr || (model_->BySession() && version == hidden_version_ && !whole_due)) {
    return false;  // by session: the version as the sessions' round trip read it has not moved (or was not read)
  }
  if (HiddenPaused(clock)) {
    return false;  // a read failed lately: the items read last stay hidden until the next try, not a try a batch
  }
  SessionStore::HiddenRead read;
  const std::string problem =
      store->Hidden(hidden_version_, hidden_entry_, &read, model_->BySession() && !whole_due, whole_due);
  if (!problem.empty()) {
    HiddenProblem(problem, clock);
    return false;
  }
  hidden_problem_.clear();
  if (!read.changed) {
    return false;  // the version has not moved: what was read last holds
  }
  // the items not hidden, on the host: the whole set anew, or the changes since the entry read last, in order
  bool* flags = visible_host_.data_ptr<bool>();
  auto apply = [&](const std::vector<int64_t>& ids, bool visible) {
    for (int64_t id : ids) {
      const int64_t index = model_->Bank().Index(id);  // 0: the catalogue does not hold it, which hides nothing
      if (index > 0) {
        flags[index] = visible;
      }
    }
  };
  if (read.full) {
    visible_host_.fill_(true);
    apply(read.ids, false);
  } else {
    for (const auto& change : read.changes) {
      apply(change.second, !change.first);
    }
  }
  const int64_t count = visible_host_.numel() - visible_host_.sum().item<int64_t>();
#ifdef TRITON_ENABLE_GPU
  std::unique_ptr<c10::cuda::CUDAStreamGuard> on_stream;
  if (device_.is_cuda()) {  // ordered before the next replay on the same stream
    on_stream = std::make_unique<c10::cuda::CUDAStreamGuard>(*capture_stream_);
  }
#endif
  c10::InferenceMode inference;
  visible_.copy_(visible_host_);
  at::logical_and_out(bank_, named_, visible_.unsqueeze(0));
  if (read.full) {
    hidden_whole_at_ = clock;
    if (read.version < hidden_version_) {  // gone from the store, or moved back: said, and the whole set read
      LOG_MESSAGE(
          TRITONSERVER_LOG_WARN, ("recserve backend: the hidden items' version went from " +
                                  std::to_string(hidden_version_) + " to " + std::to_string(read.version) +
                                  " (gone, or moved back): the whole set was read")
                                     .c_str());
    }
  }
  hidden_version_ = read.version;
  hidden_entry_ = read.entry;
  hidden_count_ = count;
  return true;
}

std::vector<at::Tensor>
ModelInstanceState::RuleTensors(int64_t rows, int64_t width) const
{
  const auto options = at::TensorOptions().dtype(at::kLong);
  const at::Tensor rules[kRuleInputs] = {
      at::zeros({rows}, options), at::zeros({rows, width}, options), at::zeros({rows, width}, options)};
  WriteRules(rows, width, rules);
  return std::vector<at::Tensor>(rules, rules + kRuleInputs);
}

void
ModelInstanceState::WriteRules(int64_t rows, int64_t width, const at::Tensor (&rules)[kRuleInputs]) const
{
  std::copy(mask_of_row_.begin(), mask_of_row_.begin() + rows, rules[0].data_ptr<int64_t>());
  for (int side = 0; side < 2; ++side) {
    int64_t* table = rules[1 + side].data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(listed_[side][r].begin(), listed_[side][r].end(), table + r * width);
    }
  }
}

#ifdef TRITON_ENABLE_GPU
void
ModelInstanceState::StageRuleTensors(int64_t rows)
{
  for (int i = 0; i < kRuleInputs; ++i) {  // the rows the last batch wrote, zero again
    const at::Tensor& staged = rule_staged_[i];
    std::memset(staged.data_ptr(), 0, staged.nbytes() / staged.size(0) * rule_rows_written_);
  }
  WriteRules(rows, kListed, rule_staged_);
  rule_rows_written_ = rows;
}

void
ModelInstanceState::PadStagedRows(int64_t rows, int64_t bucket)
{
  const int64_t length = model_->HistoryLength();
  int64_t* histories = staged_[0].data_ptr<int64_t>();
  std::fill(histories + rows * length, histories + bucket * length, model_->PaddingId());
  std::fill(staged_[1].data_ptr<int32_t>() + rows, staged_[1].data_ptr<int32_t>() + bucket, 1);
  std::fill(staged_[2].data_ptr<bool>() + rows, staged_[2].data_ptr<bool>() + bucket, false);
}
#endif

void
ModelInstanceState::StageHistories(const SessionRows& batch, std::vector<Slot>* slots)
{
  const int64_t length = model_->HistoryLength();
  const int64_t count = std::min<int64_t>(length, model_->Store().window);
  std::vector<std::vector<int64_t>> histories;
  int64_t version = hidden_version_;  // the hidden items' version, read in the same round trip under rules
  double parse_s = 0.0;
  const std::string problem = store_->AppendAndRead(
      batch.sessions, batch.events, batch.event_ids, count, &histories, model_->Rules() ? &version : nullptr,
      clock_.On() ? &parse_s : nullptr);
  if (model_->Rules()) {
    RefreshHidden(version);
  }
  clock_.Mark(kStepStore);
  clock_.Move(kStepStore, kStepParse, parse_s);
  const int32_t source = problem.empty() ? 0 : 1;
  if (!problem.empty()) {
    LOG_MESSAGE(TRITONSERVER_LOG_WARN, ("recserve backend: " + problem).c_str());
    histories = batch.events;  // each row's own items alone
    for (Slot& slot : *slots) {
      for (int64_t r = slot.first_row; r < slot.first_row + slot.rows; ++r) {
        if (histories[r].empty()) {
          slot.unavailable = kStoreUnavailable;  // the problem itself is in the log, above
        }
      }
    }
  }
  int64_t* rows = staged_[0].data_ptr<int64_t>();
  int32_t* sources = session_out_[0].data_ptr<int32_t>();
  int32_t* lengths = session_out_[1].data_ptr<int32_t>();
  for (size_t r = 0; r < histories.size(); ++r) {  // the newest `length` items, padding before them
    const std::vector<int64_t>& history = histories[r];
    const int64_t kept = std::min<int64_t>(history.size(), count);
    int64_t* row = rows + r * length;
    std::fill(row, row + length - kept, model_->PaddingId());
    std::copy(history.end() - kept, history.end(), row + length - kept);
    sources[r] = source;
    lengths[r] = static_cast<int32_t>(kept);
  }
  clock_.Mark(kStepParse);
}

void
ModelInstanceState::Run(int64_t rows, bool ruled)
{
  if (model_->Floor()) {  // no graph: the answers made at load, as wide as the batch's largest k
    const int32_t* ks = staged_[1].data_ptr<int32_t>();
    const int64_t widest = std::clamp<int64_t>(*std::max_element(ks, ks + rows), 1, model_->MaxK());
    outputs_[0] = floor_[0].narrow(0, 0, rows).narrow(1, 0, widest);
    outputs_[1] = floor_[1].narrow(0, 0, rows).narrow(1, 0, widest);
    outputs_[2] = floor_[2].narrow(0, 0, rows);
    clock_.Mark(kStepInputs);
    clock_.Mark(kStepGraph);
    return;
  }
  c10::InferenceMode inference;
#ifdef TRITON_ENABLE_GPU
  if (device_.is_cuda() && !(ruled && widest_ > kListed)) {  // longer lists run the graph as it is, below
    std::vector<Captured>& graphs = ruled ? captured_ruled_ : captured_;
    Captured* c = &graphs.back();
    for (Captured& candidate : graphs) {
      if (candidate.batch >= rows) {
        c = &candidate;
        break;
      }
    }
    // Copies of raw memory on the graph's stream, no tensor operation: each of those costs the host several
    // microseconds (dispatch, and an event recorded a copy from pinned memory): a ruled batch made fifteen.
    // The stream is synchronized below before the pinned staging is written again, so no event is needed.
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::CUDAStreamGuard capture_stream_guard(*capture_stream_);  // the stream replay() launches on
    const cudaStream_t stream = capture_stream_->stream();
    PadStagedRows(rows, c->batch);  // the rest of the bucket: empty histories asking for one item
    if (ruled) {
      StageRuleTensors(rows);  // this batch's rows' rules, the rest of the bucket none
    }
    bool copied = true;
    for (int i = 0; i < kInputs + (ruled ? kRuleInputs : 0); ++i) {  // one copy an input, the bucket's rows
      const at::Tensor& from = i < kInputs ? staged_[i] : rule_staged_[i - kInputs];
      copied = copied && cudaMemcpyAsync(c->inputs[i].data_ptr(), from.data_ptr(), c->inputs[i].nbytes(),
                                         cudaMemcpyHostToDevice, stream) == cudaSuccess;
    }
    if (!copied) {
      throw std::runtime_error("copying the batch's inputs to the GPU failed");
    }
    clock_.Mark(kStepInputs);
    c->graph->replay();
    for (int i = 0; i < kOutputs; ++i) {
      outputs_[i] = host_out_[i].narrow(0, 0, rows);
      const at::Tensor& out = c->outputs[i];
      if (!out.is_contiguous()) {  // a graph whose output is a view: its rows are not one block
        outputs_[i].copy_(out.narrow(0, 0, rows), true);
        continue;
      }
      copied = copied && cudaMemcpyAsync(outputs_[i].data_ptr(), out.data_ptr(), out.nbytes() / c->batch * rows,
                                         cudaMemcpyDeviceToHost, stream) == cudaSuccess;
    }
    const bool done = cudaStreamSynchronize(stream) == cudaSuccess;  // before the staging is written again
    if (!copied || !done) {
      throw std::runtime_error("copying the answers from the GPU failed");
    }
    clock_.Mark(kStepGraph);
    return;
  }
#endif
  if (!device_.is_cuda() && at::get_num_threads() != model_->IntraOpThreads()) {
    at::set_num_threads(model_->IntraOpThreads());  // this thread's (the instance's) intra-op threads
  }
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < kInputs; ++i) {
    inputs.push_back(staged_[i].narrow(0, 0, rows).to(device_));
  }
  if (ruled) {
    for (const at::Tensor& t : RuleTensors(rows, std::max<int64_t>(widest_, 1))) {
      inputs.push_back(t.to(device_));
    }
  }
  clock_.Mark(kStepInputs);
  std::vector<at::Tensor> out = Forward(inputs, ruled);
  for (int i = 0; i < kOutputs; ++i) {
    outputs_[i] = out[i].to(at::kCPU).contiguous();
  }
  clock_.Mark(kStepGraph);
}

TRITONSERVER_Error*
ModelInstanceState::Respond(const Slot& slot)
{
  const bool by_session = model_->BySession();
  const int outputs = by_session ? kSessionOutputs : kOutputs;
  uint32_t requested;
  RETURN_IF_ERROR(TRITONBACKEND_RequestOutputCount(slot.request, &requested));
  for (uint32_t r = 0; r < requested; ++r) {
    const char* name;
    RETURN_IF_ERROR(TRITONBACKEND_RequestOutputName(slot.request, r, &name));
    int i = 0;
    while (i < outputs && model_->OutputName(i) != name) {
      ++i;
    }
    if (i == outputs) {
      return Error(std::string("unknown output '") + name + "'");
    }
    const at::Tensor& all = i < kOutputs ? outputs_[i] : session_out_[i - kOutputs];
    const TRITONSERVER_DataType type = by_session ? kSessionOutputTypes[i] : kOutputTypes[i];
    // by session the items and scores are as wide as the request's largest k (past a row's k: -1, -inf)
    const int64_t width = (by_session && i < 2) ? std::min<int64_t>(slot.width, all.size(1)) : all.size(1);
    const int64_t shape[2] = {slot.rows, width};
    TRITONBACKEND_Output* output;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(slot.response, &output, name, type, shape, 2));
    // a row's bytes apart: the tensor's own stride (the floor's answers are a narrowed view of wider rows)
    const uint64_t stride = all.stride(0) * all.element_size(), row_bytes = width * all.element_size();
    void* buffer;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, slot.rows * row_bytes, &memory, &memory_id));
    const char* source = static_cast<const char*>(all.data_ptr()) + slot.first_row * stride;
    for (int64_t row = 0; row < (row_bytes == stride ? 1 : slot.rows); ++row) {  // one copy where rows are whole
      const uint64_t bytes = row_bytes == stride ? slot.rows * row_bytes : row_bytes;
      char* target = static_cast<char*>(buffer) + row * row_bytes;
      if (memory == TRITONSERVER_MEMORY_GPU) {
#ifdef TRITON_ENABLE_GPU
        if (cudaMemcpy(target, source + row * stride, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
          return Error(std::string("output '") + name + "': copying it to GPU memory failed", TRITONSERVER_ERROR_INTERNAL);
        }
#else
        return Error(std::string("output '") + name + "' was asked for in GPU memory", TRITONSERVER_ERROR_INTERNAL);
#endif
      } else {
        std::memcpy(target, source + row * stride, bytes);
      }
    }
  }
  return nullptr;
}

int64_t
ModelInstanceState::StageRequests(
    TRITONBACKEND_Request** requests, uint32_t request_count, std::vector<Slot>* slots, SessionRows* batch)
{
  int64_t rows = 0;
  for (uint32_t r = 0; r < request_count; ++r) {
    TRITONBACKEND_Response* response = nullptr;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, requests[r]);
    if (err != nullptr) {
      LOG_IF_ERROR(err, "recserve backend: no response could be made for a request");
      continue;
    }
    int64_t n = 0, width = 0;
    SessionRows found;
    err = model_->EventsOnly()  ? StageAppends(requests[r], rows, &n, &found, true)
          : model_->BySession() ? StageSession(requests[r], rows, &n, &width, &found)
                                : Stage(requests[r], rows, &n);
    if (err != nullptr) {  // this request alone is refused
      LOG_IF_ERROR(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err), "sending an error");
      TRITONSERVER_ErrorDelete(err);
      continue;
    }
    slots->push_back({r, requests[r], response, rows, n, width});
    rows += n;
    for (size_t row = 0; row < found.sessions.size(); ++row) {
      batch->sessions.push_back(std::move(found.sessions[row]));
      batch->events.push_back(std::move(found.events[row]));
      batch->event_ids.push_back(std::move(found.event_ids[row]));
    }
  }
  return rows;
}

void
ModelInstanceState::Release(
    TRITONBACKEND_Request** requests, uint32_t request_count, const std::vector<bool>& succeeded,
    const ExecTimes& times, int64_t rows)
{
  for (uint32_t r = 0; r < request_count; ++r) {
#ifdef TRITON_ENABLE_STATS
    LOG_IF_ERROR(
        TRITONBACKEND_ModelInstanceReportStatistics(
            TritonModelInstance(), requests[r], succeeded[r], times.start, times.compute_start, times.compute_end,
            times.end),
        "reporting request statistics");
#endif
    LOG_IF_ERROR(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL), "releasing a request");
  }
#ifdef TRITON_ENABLE_STATS
  if (rows > 0) {
    LOG_IF_ERROR(
        TRITONBACKEND_ModelInstanceReportBatchStatistics(
            TritonModelInstance(), rows, times.start, times.compute_start, times.compute_end, times.end),
        "reporting batch statistics");
  }
#endif
}

void
ModelInstanceState::ExecuteEvents(TRITONBACKEND_Request** requests, uint32_t request_count)
{
  ExecTimes times;
  SET_TIMESTAMP(times.start);
  std::vector<Slot> slots;
  std::vector<bool> succeeded(request_count, false);
  SessionRows batch;
  const int64_t rows = StageRequests(requests, request_count, &slots, &batch);
  SET_TIMESTAMP(times.compute_start);
  std::vector<std::vector<int64_t>> nothing_read;  // count 0: the append alone
  const std::string problem =
      rows > 0 ? store_->AppendAndRead(batch.sessions, batch.events, batch.event_ids, 0, &nothing_read) : "";
  if (!problem.empty()) {
    LOG_MESSAGE(TRITONSERVER_LOG_WARN, ("recserve backend: " + problem).c_str());
  }
  SET_TIMESTAMP(times.compute_end);
  for (const Slot& slot : slots) {
    TRITONSERVER_Error* err = problem.empty() ? nullptr : Error(kStoreUnavailable, TRITONSERVER_ERROR_UNAVAILABLE);
    TRITONBACKEND_Output* output = nullptr;
    const int64_t shape[2] = {slot.rows, 1};
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    if (err == nullptr) {
      const std::string& name = model_->OutputName(0);
      err = TRITONBACKEND_ResponseOutput(slot.response, &output, name.c_str(), TRITONSERVER_TYPE_INT32, shape, 2);
    }
    if (err == nullptr) {
      err = TRITONBACKEND_OutputBuffer(output, &buffer, slot.rows * sizeof(int32_t), &memory, &memory_id);
    }
    if (err == nullptr && memory != TRITONSERVER_MEMORY_CPU && memory != TRITONSERVER_MEMORY_CPU_PINNED) {
      err = Error("output 'stored' was asked for in GPU memory", TRITONSERVER_ERROR_INTERNAL);
    }
    if (err == nullptr) {  // every event of an acknowledged append is stored: now, or before under its ID
      for (int64_t row = 0; row < slot.rows; ++row) {
        const int32_t stored = static_cast<int32_t>(batch.events[slot.first_row + row].size());
        std::memcpy(static_cast<char*>(buffer) + row * sizeof(int32_t), &stored, sizeof(int32_t));
      }
    }
    LOG_IF_ERROR(TRITONBACKEND_ResponseSend(slot.response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err), "sending a response");
    succeeded[slot.index] = err == nullptr;
    if (err != nullptr) {
      TRITONSERVER_ErrorDelete(err);
    }
  }
  SET_TIMESTAMP(times.end);
  Release(requests, request_count, succeeded, times, rows);
}

void
ModelInstanceState::Execute(TRITONBACKEND_Request** requests, uint32_t request_count)
{
  if (model_->EventsOnly()) {
    ExecuteEvents(requests, request_count);
    return;
  }
  ExecTimes times;
  SET_TIMESTAMP(times.start);
  clock_.Start();
  std::vector<Slot> slots;
  std::vector<bool> succeeded(request_count, false);
  SessionRows batch;  // by session
  ruled_ = false;
  widest_ = 0;
  const int64_t rows = StageRequests(requests, request_count, &slots, &batch);
  SET_TIMESTAMP(times.compute_start);
  clock_.Mark(kStepRequests);
  std::string failure;
  if (rows > 0 && model_->BySession()) {
    try {
      StageHistories(batch, &slots);  // the hidden items too, under rules
    }
    catch (const std::exception& ex) {
      failure = std::string("recserve backend: reading the sessions failed: ") + ex.what();
    }
    clock_.Mark(kStepParse);  // after a failure: its remains (StageHistories marks its own steps)
  }
  if (rows > 0 && failure.empty()) {
    // Without sessions the hidden items' version is asked for once the batch's requests are read, and its
    // reply read after the graph ran, so the store answers while the graph runs; where it moved, the items are
    // read and the batch runs again under them before anything is answered (so a batch that begins after the
    // store acknowledged a hide still never answers the item).
    const bool asked = model_->Rules() && !model_->BySession() && SendHiddenVersion();
    clock_.Mark(kStepStore);
    auto guarded = [&](auto&& step) {
      try {
        step();
      }
      catch (const std::exception& ex) {
        failure = std::string("recserve backend: running the graph failed: ") + ex.what();
      }
    };
    guarded([&] { Run(rows, ruled_ || hidden_count_ > 0); });
    if (asked) {
      guarded([&] {
        const bool moved = RefreshHidden(-1);  // the reply read even where the graph failed: none is left behind
        clock_.Mark(kStepStore);
        if (moved && failure.empty()) {
          Run(rows, ruled_ || hidden_count_ > 0);
        }
      });
    }
  }
  SET_TIMESTAMP(times.compute_end);
  for (const Slot& slot : slots) {
    TRITONSERVER_Error* err = !failure.empty()            ? Error(failure, TRITONSERVER_ERROR_INTERNAL)
                              : !slot.unavailable.empty() ? Error(slot.unavailable, TRITONSERVER_ERROR_UNAVAILABLE)
                                                          : Respond(slot);
    LOG_IF_ERROR(TRITONBACKEND_ResponseSend(slot.response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err), "sending a response");
    succeeded[slot.index] = err == nullptr;
    if (err != nullptr) {
      TRITONSERVER_ErrorDelete(err);
    }
  }
  SET_TIMESTAMP(times.end);
  clock_.Mark(kStepAnswers);
  if (clock_.On() && rows > 0) {
    const std::string summary = clock_.EndBatch(ruled_ || hidden_count_ > 0);
    if (!summary.empty()) {
      LOG_MESSAGE(TRITONSERVER_LOG_INFO, ("recserve backend: " + Name() + ": " + summary).c_str());
    }
  }
  Release(requests, request_count, succeeded, times, rows);
}

extern "C" {

TRITONSERVER_Error*
TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend)
{
  uint32_t major, minor;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    return Error(
        "the recserve backend was built for backend API " + std::to_string(TRITONBACKEND_API_VERSION_MAJOR) + "." +
            std::to_string(TRITONBACKEND_API_VERSION_MINOR) + ", the server has " + std::to_string(major) + "." +
            std::to_string(minor),
        TRITONSERVER_ERROR_UNSUPPORTED);
  }
  return nullptr;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  ModelState* state;
  RETURN_IF_ERROR(ModelState::Create(model, &state));
  return TRITONBACKEND_ModelSetState(model, state);
}

TRITONSERVER_Error*
TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model)
{
  void* state;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &state));
  delete static_cast<ModelState*>(state);
  return nullptr;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance)
{
  TRITONBACKEND_Model* model;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* model_state;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &model_state));
  ModelInstanceState* state;
  RETURN_IF_ERROR(ModelInstanceState::Create(static_cast<ModelState*>(model_state), instance, &state));
  return TRITONBACKEND_ModelInstanceSetState(instance, state);
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance)
{
  void* state;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  delete static_cast<ModelInstanceState*>(state);
  return nullptr;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t request_count)
{
  void* state;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &state));
  static_cast<ModelInstanceState*>(state)->Execute(requests, request_count);
  return nullptr;  // every request has been answered and released
}

}  // extern "C"

}}}  // namespace triton::backend::recserve
