#include "session_store.h"

#include <hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "triton/backend/backend_common.h"

namespace triton { namespace backend { namespace recserve {

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval Timeval(double seconds)
{
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  return tv;
}

// An integer item ID as the store keeps it (its text); false for anything else.
bool ParseId(const char* text, size_t length, int64_t* id)
{
  if (length == 0 || length > 20) {
    return false;
  }
  char buffer[24];
  std::memcpy(buffer, text, length);
  buffer[length] = '\0';
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(buffer, &end, 10);
  if (errno != 0 || end != buffer + length) {
    return false;
  }
  *id = value;
  return true;
}

// Whether a TritonJson call succeeded (its error, if any, freed).
bool Succeeded(TRITONSERVER_Error* err)
{
  if (err == nullptr) {
    return true;
  }
  TRITONSERVER_ErrorDelete(err);
  return false;
}

std::string MemberString(common::TritonJson::Value& record, const char* key, std::string* value)
{
  common::TritonJson::Value member;
  if (!record.Find(key, &member) || member.IsNull()) {
    return "";
  }
  return Succeeded(member.AsString(value)) ? "" : std::string(key) + " is not a string";
}

std::string MemberNumber(common::TritonJson::Value& record, const char* key, double* value)
{
  common::TritonJson::Value member;
  if (!record.Find(key, &member) || member.IsNull()) {
    return "";
  }
  return Succeeded(member.AsDouble(value)) ? "" : std::string(key) + " is not a number";
}

}  // namespace

std::string
ParseStoreRecord(const std::string& json, StoreSettings* s)
{
  common::TritonJson::Value record;
  if (!Succeeded(record.Parse(json)) || !record.IsObject()) {
    return "the session_store parameter is not a JSON object";
  }
  double window = static_cast<double>(s->window), ttl = 0, timeout = s->timeout_s;
  for (std::string problem :
       {MemberString(record, "url", &s->url), MemberString(record, "username", &s->username),
        MemberString(record, "password_file", &s->password_file), MemberString(record, "prefix", &s->prefix),
        MemberNumber(record, "window", &window), MemberNumber(record, "ttl_s", &ttl),
        MemberNumber(record, "timeout_s", &timeout)}) {
    if (!problem.empty()) {
      return "session_store: " + problem;
    }
  }
  s->window = static_cast<int64_t>(window);
  s->ttl_s = static_cast<int64_t>(ttl);
  s->timeout_s = timeout;
  if (s->window < 1 || s->ttl_s < 0 || !(s->timeout_s > 0)) {
    return "session_store: window must be at least 1, ttl_s at least 0 and timeout_s positive";
  }
  const std::string scheme = "redis://";
  if (s->url.compare(0, scheme.size(), scheme) != 0) {
    return "session_store: url " + s->url +
           ": the native layout reaches a store at redis://HOST:PORT/DB (no TLS, no unix socket); "
           "the session layout (python) takes rediss:// and unix://";
  }
  if (s->url.find('@') != std::string::npos) {  // never a password in the URL, as recserve's records say
    return "session_store: url: give the credentials as username and password_file, not in the URL";
  }
  std::string rest = s->url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string address = rest.substr(0, slash);
  if (slash != std::string::npos && slash + 1 < rest.size()) {
    s->db = std::atoi(rest.c_str() + slash + 1);
  }
  const size_t colon = address.rfind(':');
  s->host = address.substr(0, colon);
  if (colon != std::string::npos) {
    s->port = std::atoi(address.c_str() + colon + 1);
  }
  if (s->host.size() > 2 && s->host.front() == '[' && s->host.back() == ']') {
    s->host = s->host.substr(1, s->host.size() - 2);
  }
  if (s->host.empty() || s->port <= 0 || s->port > 65535) {
    return "session_store: url " + s->url + " names no host and port";
  }
  return "";
}

std::string
SessionIdProblem(const std::string& session)
{
  size_t characters = 0;
  for (size_t i = 0; i < session.size(); ++characters) {
    const unsigned char lead = session[i];
    const size_t width = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (width == 0 || i + width > session.size()) {
      return "not UTF-8";
    }
    for (size_t j = 1; j < width; ++j) {
      if ((static_cast<unsigned char>(session[i + j]) >> 6) != 0x2) {
        return "not UTF-8";
      }
    }
    i += width;
  }
  if (characters == 0) {
    return "an empty session ID";
  }
  if (characters > 256) {
    return "a session ID over 256 characters";
  }
  return "";
}

SessionStore::~SessionStore()
{
  Drop();
}

void
SessionStore::Drop()
{
  if (c_ != nullptr) {
    redisFree(c_);
    c_ = nullptr;
  }
}

std::string
SessionStore::Connect()
{
  const std::string where = "the session store at " + s_.url;
  std::string password;
  if (!s_.password_file.empty()) {
    std::ifstream file(s_.password_file);
    if (!file || !std::getline(file, password)) {
      return "password_file=" + s_.password_file + ": cannot read a password from it";
    }
    if (!password.empty() && password.back() == '\r') {
      password.pop_back();
    }
  }
  c_ = redisConnectWithTimeout(s_.host.c_str(), s_.port, Timeval(s_.timeout_s));
  if (c_ == nullptr || c_->err) {
    const std::string why = c_ != nullptr ? c_->errstr : "out of memory";
    Drop();
    return where + " cannot be reached: " + why;
  }
  redisSetTimeout(c_, Timeval(s_.timeout_s));
  std::vector<std::string> hello;
  if (!password.empty()) {
    hello = s_.username.empty() ? std::vector<std::string>{"AUTH", password}
                                : std::vector<std::string>{"AUTH", s_.username, password};
  }
  for (const std::vector<std::string>& command :
       {hello, s_.db != 0 ? std::vector<std::string>{"SELECT", std::to_string(s_.db)} : std::vector<std::string>{}}) {
    if (command.empty()) {
      continue;
    }
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& word : command) {
      argv.push_back(word.data());
      lengths.push_back(word.size());
    }
    Reply reply(static_cast<redisReply*>(redisCommandArgv(c_, argv.size(), argv.data(), lengths.data())));
    if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) {
      const std::string why = reply != nullptr ? reply->str : c_->errstr;
      Drop();
      return where + (command[0] == "AUTH" ? " refused recserve's credentials: " : " refused SELECT: ") + why;
    }
  }
  return "";
}

std::string
SessionStore::RoundTrip(
    const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events, int64_t count,
    std::vector<std::vector<int64_t>>* histories, bool* retryable)
{
  *retryable = false;
  std::vector<std::string> keys;
  for (const std::string& session : sessions) {
    keys.push_back(s_.prefix + "s:" + session);
  }
  const std::string window = std::to_string(-s_.window), ttl = std::to_string(s_.ttl_s);
  const std::string first = std::to_string(-count);
  size_t expected = 0;
  auto send = [&](const std::vector<std::string>& words) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& word : words) {
      argv.push_back(word.data());
      lengths.push_back(word.size());
    }
    redisAppendCommandArgv(c_, argv.size(), argv.data(), lengths.data());
    ++expected;
  };
  bool appending = false;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (events[i].empty()) {
      continue;
    }
    if (!appending) {
      send({"MULTI"});
      appending = true;
    }
    std::vector<std::string> push = {"RPUSH", keys[i]};
    for (int64_t id : events[i]) {
      push.push_back(std::to_string(id));
    }
    send(push);
    send({"LTRIM", keys[i], window, "-1"});
    if (s_.ttl_s > 0) {
      send({"EXPIRE", keys[i], ttl});
    }
  }
  const size_t transaction = appending ? expected : 0;  // replies up to EXEC's
  if (appending) {
    send({"EXEC"});
  }
  for (const std::string& key : keys) {
    send({"LRANGE", key, first, "-1"});
  }
  std::string problem;
  histories->assign(sessions.size(), {});
  for (size_t n = 0; n < expected; ++n) {
    void* raw = nullptr;
    if (redisGetReply(c_, &raw) != REDIS_OK) {
      const bool timeout = c_->err == REDIS_ERR_TIMEOUT ||
                           (c_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK));
      const std::string why = c_->errstr;
      *retryable = n == 0 && !timeout;  // nothing answered, and not slow: the connection was gone
      Drop();
      if (timeout) {
        return "the session store at " + s_.url + " did not answer within " + std::to_string(s_.timeout_s) + " s";
      }
      return "the session store at " + s_.url + " cannot be reached: " + why;
    }
    Reply reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR && problem.empty()) {
      problem = "the session store at " + s_.url + " refused " + (appending && n <= transaction ? "the append" : "the read") +
                ": " + reply->str;
      continue;
    }
    if (appending && n == transaction && problem.empty()) {
      bool applied = reply->type == REDIS_REPLY_ARRAY;
      for (size_t e = 0; applied && e < reply->elements; ++e) {
        applied = reply->element[e]->type != REDIS_REPLY_ERROR;
      }
      if (!applied) {
        problem = "the session store at " + s_.url + " did not apply the append";
      }
    }
    if (n > transaction || (!appending && n >= transaction)) {
      const size_t row = n - (appending ? transaction + 1 : 0);
      if (reply->type != REDIS_REPLY_ARRAY) {
        continue;
      }
      std::vector<int64_t>& history = (*histories)[row];
      for (size_t e = 0; e < reply->elements; ++e) {
        const redisReply* item = reply->element[e];
        int64_t id;
        if (item->type == REDIS_REPLY_STRING && ParseId(item->str, item->len, &id)) {
          history.push_back(id);
        }
      }
    }
  }
  return problem;
}

std::string
SessionStore::AppendAndRead(
    const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events, int64_t count,
    std::vector<std::vector<int64_t>>* histories)
{
  // one retry at most, on a fresh connection, and only where an old one was found closed before any answer
  // (as a restarted store leaves it): a call the store answered in part, or was slow to, is not sent twice
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool fresh = c_ == nullptr;
    if (fresh) {
      std::string problem = Connect();
      if (!problem.empty()) {
        return problem;
      }
    }
    bool retryable = false;
    std::string problem = RoundTrip(sessions, events, count, histories, &retryable);
    if (problem.empty() || !retryable || fresh) {
      return problem;
    }
  }
  return "the session store at " + s_.url + " cannot be reached";
}

}}}  // namespace triton::backend::recserve
