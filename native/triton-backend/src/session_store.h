// The session store as recserve's backend reads it (the native_session layout): a Redis-protocol server
// (Valkey or Redis) reached through hiredis, with the keys, ACL user and limits of recserve's StoreSettings
// (src/recserve/sessions/store_settings.py). One connection an instance; every call bounded by timeout_s.

#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

struct redisContext;

namespace triton { namespace backend { namespace recserve {

// What a client is told when the store fails its request (constants.STORE_UNAVAILABLE): never the store's
// address or keys, which the server's log gives.
constexpr const char* kStoreUnavailable = "the session store is unavailable; the server's log says why";
// the most elements a reply of a hidden items' read may hold: a set of 4 million items, and past the stream's
// most (store_contract.HIDDEN_CHANGES_KEPT x HIDDEN_CHANGE_MAX_ITEMS items, a field and a value each)
constexpr long long kHiddenReplyCap = 4000000;

// The store's record as `recserve repo` writes it into config.pbtxt (never the password: its file).
struct StoreSettings {
  std::string url;
  std::string host;
  int port = 6379;
  int db = 0;
  std::string username;  // empty: the server's default user
  std::string password_file;  // empty: no password
  std::string prefix = "recserve:";
  int64_t window = 200;
  int64_t ttl_s = 0;
  double timeout_s = 0.25;
  std::vector<std::pair<std::string, int>> sentinels;  // high availability: who names the primary of `service`
  std::string service = "recserve";
  bool wait_replica = false;  // acknowledge "replica": a WAIT for one replica after each append
};

// Reads the record (JSON); returns "" or what is wrong with it.
std::string ParseStoreRecord(const std::string& json, StoreSettings* settings);

// A session ID as recserve's stores take it: valid UTF-8, 1 to 256 characters. Returns "" or the problem.
std::string SessionIdProblem(const std::string& session);

// An integer item ID as the store keeps it (store_contract.is_integer_id: canonical decimal, int64, not -1).
bool ParseItemId(const char* text, size_t length, int64_t* id);

// The steady clock, in seconds: deadlines, pauses and the batches' step times.
double Monotonic();

// A password file's password as recserve reads it (its first line; empty or padded refused): "" or the problem.
std::string ReadPassword(const std::string& path, std::string* password);

class SessionStore {
 public:
  explicit SessionStore(const StoreSettings& settings) : s_(settings) {}
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Appends events[i] to sessions[i] (one MULTI/EXEC for the whole call: each session's ZADD NX of one member
  // an event, ZREMRANGEBYRANK to the window and EXPIRE), then reads each session's newest `count` members
  // (ZRANGE), all in one round trip. Items that break the store's rule (ParseItemId) are left out of
  // `histories` (unknown to the model either way); a key the store cannot read as a session reads empty.
  // Returns "" or the store's problem (a timeout, a refused password, no connection): then nothing is read,
  // and the events are acknowledged only if a later call says so.
  // `hidden_version`, where given: the hidden items' version read in the same round trip (unchanged where the
  // store did not answer it).
  // `event_ids[i][e]`: the client's ID of events[i][e] (the member "ID ITEM", which ZADD NX stores once
  // however often it is sent), "" or absent for one of the batch's own. `count` 0: the append alone, nothing
  // read (the events-only model's). `parse_s`, where given: the seconds spent reading the replies' members into
  // item IDs (the rest of the call is the round trip itself: commands sent, replies awaited and decoded).
  std::string AppendAndRead(
      const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events,
      const std::vector<std::vector<std::string>>& event_ids, int64_t count,
      std::vector<std::vector<int64_t>>* histories, int64_t* hidden_version = nullptr, double* parse_s = nullptr);

  // What a read of the items hidden catalogue-wide found: the whole set, or the changes after an entry.
  struct HiddenRead {
    bool changed = false;  // the version moved, and what follows was read
    bool full = false;  // ids: the whole set; otherwise changes, in order (hidden or shown, their items)
    std::vector<int64_t> ids;
    std::vector<std::pair<bool, std::vector<int64_t>>> changes;
    int64_t version = 0;
    std::string entry;  // the stream's last entry ("" where it holds none): where the next read goes on
  };

  // The items hidden catalogue-wide (`recserve items hide`, store_contract.HIDDEN_KEY): where the store's
  // version (HIDDEN_VERSION_KEY, 0 before any hide) is not `known`, what changed since `entry` (the stream of
  // changes, HIDDEN_CHANGES_KEY, read from it on), or the whole set where the stream no longer keeps `entry`
  // (or `entry` is ""), where a change was too large to keep as items (store_contract.WHOLE_SET), or where the
  // version moved by more or less than one a change read (a writer that changed the set without its entry);
  // either with its version in one MULTI/EXEC. `version_read`: the
  // version was just read (by AppendAndRead) and is `known`'s rival, so no GET is sent first. `whole_due`: no
  // version to follow (none there, 0, or not a count) and the whole set not read for a while: it is read
  // again (a version that cannot be followed never means a set that is never read). The reads run under one
  // deadline (the store's timeout) and a cap on a reply's elements (kHiddenReplyCap). Integer IDs only; others
  // hide nothing. Returns "" or the store's problem (then nothing is read).
  std::string Hidden(
      int64_t known, const std::string& entry, HiddenRead* read, bool version_read = false, bool whole_due = false);

  // The hidden items' version asked for now, its reply read by the next Hidden (which then sends no GET of its
  // own): a batch sends it once its requests are read and runs its graph while the store answers. Returns ""
  // or the store's problem (then nothing is pending, and Hidden asks again itself).
  std::string SendVersion();

  const StoreSettings& Settings() const { return s_; }

 private:
  std::string Connect();  // Dial, or the last problem while a failed store's pause lasts
  std::string Dial();
  std::string AskSentinels(std::string* host, int* port);  // the primary of s_.service: "" or the problem
  std::string RoundTrip(
      const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events,
      const std::vector<std::vector<std::string>>& event_ids, int64_t count,
      std::vector<std::vector<int64_t>>* histories, int64_t* hidden_version, bool* retryable, double* parse_s);
  void Drop();
  // The most elements a reply of ours may hold: a read's window or a transaction's commands (a session
  // written past any sense is refused, not read); the hidden items' read alone lifts it.
  long long ReplyGuard() const { return std::max<int64_t>(4 * s_.window, 1024) + 3 * 4096; }

  StoreSettings s_;
  redisContext* c_ = nullptr;
  bool version_sent_ = false;  // SendVersion's GET awaits its reply on c_
  double retry_at_ = 0;  // steady-clock seconds before which no new connection is tried
  double backoff_s_ = 0;
  std::string last_problem_;
  std::mt19937_64 random_{std::random_device{}()};
};

}}}  // namespace triton::backend::recserve
