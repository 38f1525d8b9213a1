// The session store as recserve's backend reads it (the native_session layout): a Redis-protocol server
// (Valkey or Redis) reached through hiredis, with the keys, ACL user and limits of recserve's StoreSettings
// (src/recserve/sessions/store_settings.py). One connection an instance; every call bounded by timeout_s.

#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct redisContext;

namespace triton { namespace backend { namespace recserve {

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
};

// Reads the record (JSON); returns "" or what is wrong with it.
std::string ParseStoreRecord(const std::string& json, StoreSettings* settings);

// A session ID as recserve's stores take it: valid UTF-8, 1 to 256 characters. Returns "" or the problem.
std::string SessionIdProblem(const std::string& session);

class SessionStore {
 public:
  explicit SessionStore(const StoreSettings& settings) : s_(settings) {}
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Appends events[i] to sessions[i] (one MULTI/EXEC for the whole call: each session's RPUSH, LTRIM to the
  // window and EXPIRE), then reads each session's newest `count` items (LRANGE), all in one round trip.
  // Items that are not integers are left out of `histories` (unknown to the model either way).
  // Returns "" or the store's problem (a timeout, a refused password, no connection): then nothing is read,
  // and the events are acknowledged only if a later call says so.
  std::string AppendAndRead(
      const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events, int64_t count,
      std::vector<std::vector<int64_t>>* histories);

  const StoreSettings& Settings() const { return s_; }

 private:
  std::string Connect();
  std::string RoundTrip(
      const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events, int64_t count,
      std::vector<std::vector<int64_t>>* histories, bool* retryable);
  void Drop();

  StoreSettings s_;
  redisContext* c_ = nullptr;
};

}}}  // namespace triton::backend::recserve
