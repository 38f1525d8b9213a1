#include "session_store.h"

#include <arpa/inet.h>
#include <hiredis.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

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

// A command's words as hiredis takes them (pointers and lengths; the words must outlive it).
struct Argv {
  explicit Argv(const std::vector<std::string>& words)
  {
    for (const std::string& word : words) {
      argv.push_back(word.data());
      lengths.push_back(word.size());
    }
  }
  int argc() const { return static_cast<int>(argv.size()); }
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
};

// One command sent and its reply read (null where the connection failed: its errstr says why).
Reply Command(redisContext* c, const std::vector<std::string>& words)
{
  Argv command(words);
  return Reply(static_cast<redisReply*>(redisCommandArgv(c, command.argc(), command.argv.data(), command.lengths.data())));
}

double Now()
{
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host's first address as text, looked up in a thread of its own so that a slow resolver costs a batch
// at most `timeout_s` (getaddrinfo has no timeout of its own); "" and `why` where none came in time.
std::string Resolve(const std::string& host, double timeout_s, std::string* why)
{
  struct Lookup {
    std::mutex m;
    std::condition_variable done_cv;
    bool done = false;
    std::string address, error;
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host]() {
    addrinfo hints{}, *found = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
    std::string address, error;
    if (rc != 0 || found == nullptr) {
      error = gai_strerror(rc);
    } else {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* raw = found->ai_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
      inet_ntop(found->ai_family, raw, text, sizeof(text));
      address = text;
    }
    if (found != nullptr) {
      freeaddrinfo(found);
    }
    std::lock_guard<std::mutex> lock(lookup->m);
    lookup->address = address;
    lookup->error = error;
    lookup->done = true;
    lookup->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(lookup->m);
  if (!lookup->done_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return lookup->done; })) {
    *why = "the name " + host + " did not resolve within " + std::to_string(timeout_s) + " s";
    return "";
  }
  *why = lookup->error.empty() ? "" : "the name " + host + " does not resolve: " + lookup->error;
  return lookup->address;
}

// The hidden items' version from a GET's reply (nil: 0, before any hide); false where it is not one.
bool ParseVersion(const redisReply* reply, int64_t* version)
{
  if (reply->type == REDIS_REPLY_NIL) {
    *version = 0;
    return true;
  }
  if (reply->type != REDIS_REPLY_STRING) {
    return false;
  }
  char* end = nullptr;
  const std::string text(reply->str, reply->len);
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') {
    return false;
  }
  *version = value;
  return true;
}

}  // namespace

double
Monotonic()
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool
ParseItemId(const char* text, size_t length, int64_t* id)
{
  // store_contract.INTEGER_ID_PATTERN: 0, or an optional '-' then a digit 1-9 and at most 18 more digits
  const bool negative = length > 0 && text[0] == '-';
  const size_t digits = length - (negative ? 1 : 0);
  const char* first = text + (negative ? 1 : 0);
  if (digits == 0 || digits > 19 || (first[0] == '0' && (digits > 1 || negative))) {
    return false;
  }
  uint64_t magnitude = 0;
  for (size_t i = 0; i < digits; ++i) {
    if (first[i] < '0' || first[i] > '9') {
      return false;
    }
    magnitude = magnitude * 10 + static_cast<uint64_t>(first[i] - '0');  // 19 digits fit in uint64
  }
  const uint64_t limit = negative ? (uint64_t(1) << 63) : (uint64_t(1) << 63) - 1;
  if (magnitude > limit) {
    return false;
  }
  const int64_t value = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  if (value == -1) {  // the native padding is never an item
    return false;
  }
  *id = value;
  return true;
}

namespace {

// A stored member, "EVENT_ID ITEM": the item's ID, if it is an integer ID (store_contract.stored_ids).
bool MemberItem(const redisReply* member, int64_t* id)
{
  if (member->type != REDIS_REPLY_STRING) {
    return false;
  }
  const char* space = static_cast<const char*>(std::memchr(member->str, ' ', member->len));
  if (space == nullptr) {
    return false;
  }
  const size_t offset = static_cast<size_t>(space - member->str) + 1;
  return ParseItemId(member->str + offset, member->len - offset, id);
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

std::string ParseSentinels(common::TritonJson::Value& record, std::vector<std::pair<std::string, int>>* sentinels)
{
  common::TritonJson::Value list;
  if (!record.Find("sentinels", &list) || list.IsNull()) {
    return "";
  }
  if (!list.IsArray()) {
    return "sentinels is not a list";
  }
  for (size_t i = 0; i < list.ArraySize(); ++i) {
    std::string address;
    if (!Succeeded(list.IndexAsString(i, &address))) {
      return "sentinels holds something other than HOST:PORT text";
    }
    const size_t colon = address.rfind(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
    if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535) {
      return "sentinel " + address + " is not HOST:PORT";
    }
    sentinels->emplace_back(address.substr(0, colon), port);
  }
  return "";
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
  std::string acknowledge = "primary";
  for (std::string problem :
       {MemberString(record, "service", &s->service), MemberString(record, "acknowledge", &acknowledge),
        ParseSentinels(record, &s->sentinels)}) {
    if (!problem.empty()) {
      return "session_store: " + problem;
    }
  }
  if (acknowledge != "primary" && acknowledge != "replica") {
    return "session_store: acknowledge must be primary or replica, not " + acknowledge;
  }
  s->wait_replica = acknowledge == "replica";
  // checked as doubles before any cast (a cast of one past int64 is undefined)
  if (!(window >= 1 && window <= 1e6) || !(ttl >= 0 && ttl <= 1e10) || !(timeout > 0 && timeout <= 3600)) {
    return "session_store: window must be 1 to 1,000,000, ttl_s 0 to 1e10 and timeout_s above 0, at most 3600";
  }
  s->window = static_cast<int64_t>(window);
  s->ttl_s = static_cast<int64_t>(ttl);
  s->timeout_s = timeout;
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
  // UTF-8 as Python decodes it: no overlong forms, no surrogates, nothing past U+10FFFF
  size_t characters = 0;
  for (size_t i = 0; i < session.size(); ++characters) {
    const unsigned char lead = session[i];
    const size_t width = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (width == 0 || i + width > session.size()) {
      return "not UTF-8";
    }
    uint32_t code = width == 1 ? lead : lead & (0xFF >> (width + 1));
    for (size_t j = 1; j < width; ++j) {
      const unsigned char next = session[i + j];
      if ((next >> 6) != 0x2) {
        return "not UTF-8";
      }
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < least[width] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
      return "not UTF-8";
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
  version_sent_ = false;
}

std::string
ReadPassword(const std::string& path, std::string* password)
{
  // store_settings.read_password and password_problem: the first line without its end, neither empty nor padded
  std::ifstream file(path);
  if (!file) {
    return "password_file=" + path + ": cannot read a password from it";
  }
  password->clear();
  std::getline(file, *password);
  if (!password->empty() && password->back() == '\r') {
    password->pop_back();
  }
  if (password->empty()) {
    return "password_file=" + path + ": the password is empty";
  }
  const char* blanks = " \t\v\f\r";
  if (std::strchr(blanks, password->front()) != nullptr || std::strchr(blanks, password->back()) != nullptr) {
    return "password_file=" + path + ": the password begins or ends with a blank (a space, a tab); write it without";
  }
  return "";
}

std::string
SessionStore::Connect()
{
  // a store that refused or could not be reached is tried again after a pause (doubling to 1 s), not on
  // every batch: until then each batch gets the last problem at once
  if (Monotonic() < retry_at_) {
    return last_problem_;
  }
  std::string problem = Dial();
  if (problem.empty()) {
    backoff_s_ = 0;
    return "";
  }
  backoff_s_ = std::min(1.0, backoff_s_ > 0 ? backoff_s_ * 2 : 0.05);
  retry_at_ = Monotonic() + backoff_s_;
  last_problem_ = problem;
  return problem;
}

std::string
SessionStore::AskSentinels(std::string* host, int* port)
{
  std::string problems;
  for (const auto& sentinel : s_.sentinels) {
    std::string why;
    const std::string address = Resolve(sentinel.first, s_.timeout_s, &why);
    redisContext* c = address.empty() ? nullptr : redisConnectWithTimeout(address.c_str(), sentinel.second, Timeval(s_.timeout_s));
    if (c != nullptr && c->err == 0) {
      redisSetTimeout(c, Timeval(s_.timeout_s));
      Reply reply = Command(c, {"SENTINEL", "get-master-addr-by-name", s_.service});
      if (reply != nullptr && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
          reply->element[0]->type == REDIS_REPLY_STRING && reply->element[1]->type == REDIS_REPLY_STRING) {
        *host = std::string(reply->element[0]->str, reply->element[0]->len);
        *port = std::atoi(reply->element[1]->str);
        redisFree(c);
        return "";
      }
      why = reply == nullptr ? c->errstr : "it names no primary of " + s_.service;
    } else if (c != nullptr) {
      why = c->errstr;
    }
    if (c != nullptr) {
      redisFree(c);
    }
    problems += (problems.empty() ? "" : "; ") + sentinel.first + ":" + std::to_string(sentinel.second) + " " + why;
  }
  return "no Sentinel named the primary (" + problems + ")";
}

std::string
SessionStore::Dial()
{
  const std::string where = "the session store at " + s_.url;
  std::string password;
  if (!s_.password_file.empty()) {
    const std::string problem = ReadPassword(s_.password_file, &password);  // anew: a rotated password
    if (!problem.empty()) {
      return problem;
    }
  }
  std::string host = s_.host, why;
  int port = s_.port;
  if (!s_.sentinels.empty()) {  // the primary as the Sentinels name it now (after a failover, the new one)
    const std::string problem = AskSentinels(&host, &port);
    if (!problem.empty()) {
      return where + ": " + problem;
    }
  }
  const std::string address = Resolve(host, s_.timeout_s, &why);
  if (address.empty()) {
    return where + " cannot be reached: " + why;
  }
  c_ = redisConnectWithTimeout(address.c_str(), port, Timeval(s_.timeout_s));
  if (c_ == nullptr || c_->err) {
    const std::string why = c_ != nullptr ? c_->errstr : "out of memory";
    Drop();
    return where + " cannot be reached: " + why;
  }
  redisSetTimeout(c_, Timeval(s_.timeout_s));
  c_->reader->maxelements = ReplyGuard();
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
    Reply reply = Command(c_, command);
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
    const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events,
    const std::vector<std::vector<std::string>>& event_ids, int64_t count,
    std::vector<std::vector<int64_t>>* histories, int64_t* hidden_version, bool* retryable, double* parse_s)
{
  *retryable = false;
  const double deadline = Monotonic() + s_.timeout_s;  // one deadline for the whole call, not one a reply
  std::vector<std::string> keys;
  for (const std::string& session : sessions) {
    keys.push_back(s_.prefix + "h:" + session);  // store_contract.HISTORY_KEY
  }
  const std::string window = std::to_string(-s_.window - 1), ttl = std::to_string(s_.ttl_s);
  const std::string first = std::to_string(-count);
  size_t expected = 0;
  bool sent = true;
  auto send = [&](const std::vector<std::string>& words) {
    Argv command(words);
    sent = sent && redisAppendCommandArgv(c_, command.argc(), command.argv.data(), command.lengths.data()) == REDIS_OK;
    ++expected;
  };
  // each event one member, "EVENT_ID ITEM" scored by now (a microsecond apart in row order), its ID the
  // client's where it gave one (sent again, ZADD NX stores it once), else made of this batch's random token
  // (store_contract)
  char token[32];
  std::snprintf(token, sizeof(token), "%016llx", static_cast<unsigned long long>(random_()));
  const double now = Now();
  bool appending = false;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (events[i].empty()) {
      continue;
    }
    if (!appending) {
      send({"MULTI"});
      appending = true;
    }
    std::vector<std::string> add = {"ZADD", keys[i], "NX"};
    for (size_t e = 0; e < events[i].size(); ++e) {
      char score[32];
      std::snprintf(score, sizeof(score), "%.6f", now + 1e-6 * static_cast<double>(e));
      add.push_back(score);
      const bool given = i < event_ids.size() && e < event_ids[i].size() && !event_ids[i][e].empty();
      const std::string id =
          given ? event_ids[i][e] : std::string(token) + "-" + std::to_string(i) + "-" + std::to_string(e);
      add.push_back(id + " " + std::to_string(events[i][e]));
    }
    send(add);
    send({"ZREMRANGEBYRANK", keys[i], "0", window});
    if (s_.ttl_s > 0) {
      send({"EXPIRE", keys[i], ttl});
    }
  }
  const size_t transaction = appending ? expected : 0;  // replies up to EXEC's
  const size_t waited = appending && s_.wait_replica ? 1 : 0;  // WAIT's reply after EXEC's
  if (appending) {
    send({"EXEC"});
    if (waited) {
      send({"WAIT", "1", std::to_string(static_cast<int64_t>(s_.timeout_s * 1000))});
    }
  }
  for (size_t i = 0; i < keys.size() && count > 0; ++i) {  // count 0: an append alone (events), nothing read
    send({"ZRANGE", keys[i], first, "-1"});
  }
  if (hidden_version != nullptr) {
    send({"GET", s_.prefix + "items:version"});  // store_contract.HIDDEN_VERSION_KEY: the last reply
  }
  if (!sent) {
    Drop();
    return "the session store at " + s_.url + ": a command could not be queued (out of memory)";
  }
  std::string problem;
  bool demoted = false;  // the server we reach is a replica now (a failover): find the primary again
  histories->assign(sessions.size(), {});
  for (size_t n = 0; n < expected; ++n) {
    const double left = deadline - Monotonic();
    void* raw = nullptr;
    if (left <= 0 || redisSetTimeout(c_, Timeval(left)) != REDIS_OK || redisGetReply(c_, &raw) != REDIS_OK) {
      const bool timeout = left <= 0 || c_->err == REDIS_ERR_TIMEOUT ||
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
    const bool queued = appending && n < transaction;  // MULTI's and each command's QUEUED
    if (reply->type == REDIS_REPLY_ERROR && (queued || (appending && n == transaction)) && problem.empty()) {
      // the transaction as a whole was refused (a NOPERM, a NOAUTH): no row's append is acknowledged
      problem = "the session store at " + s_.url + " refused the append: " + std::string(reply->str, reply->len);
      demoted = demoted || std::strncmp(reply->str, "READONLY", 8) == 0;
      continue;
    }
    if (waited && n == transaction + 1) {  // the WAIT: the answer still holds the rows' items, said in the log
      if (reply->type != REDIS_REPLY_INTEGER || reply->integer < 1) {
        LOG_MESSAGE(TRITONSERVER_LOG_WARN, "recserve backend: no replica confirmed a batch's append in time");
      }
      continue;
    }
    if (hidden_version != nullptr && n + 1 == expected) {
      ParseVersion(reply.get(), hidden_version);
      continue;
    }
    if (n > transaction + waited || (!appending && n >= transaction)) {
      const size_t row = n - (appending ? transaction + 1 + waited : 0);
      if (reply->type != REDIS_REPLY_ARRAY) {
        continue;  // a key the store cannot read as a session (WRONGTYPE): that row's loss alone, empty
      }
      std::vector<int64_t>& history = (*histories)[row];
      const double parsing = parse_s != nullptr ? Monotonic() : 0.0;  // no clock read where nobody asks
      for (size_t e = 0; e < reply->elements; ++e) {
        int64_t id;
        if (MemberItem(reply->element[e], &id)) {
          history.push_back(id);
        }
      }
      if (parse_s != nullptr) {
        *parse_s += Monotonic() - parsing;
      }
    }
  }
  if (demoted) {
    Drop();
  }
  return problem;
}

std::string
SessionStore::AppendAndRead(
    const std::vector<std::string>& sessions, const std::vector<std::vector<int64_t>>& events,
    const std::vector<std::vector<std::string>>& event_ids, int64_t count,
    std::vector<std::vector<int64_t>>* histories, int64_t* hidden_version, double* parse_s)
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
    if (parse_s != nullptr) {
      *parse_s = 0.0;  // a retry's parsing alone: the first try's replies are dropped with it
    }
    std::string problem =
        RoundTrip(sessions, events, event_ids, count, histories, hidden_version, &retryable, parse_s);
    if (problem.empty() || !retryable || fresh) {
      return problem;
    }
  }
  return "the session store at " + s_.url + " cannot be reached";
}

std::string
SessionStore::SendVersion()
{
  if (version_sent_) {  // an earlier ask's reply was never read: this connection's next reply would be that one
    Drop();
  }
  if (c_ == nullptr) {
    const std::string problem = Connect();
    if (!problem.empty()) {
      return problem;
    }
  }
  redisSetTimeout(c_, Timeval(s_.timeout_s));
  const std::vector<std::string> words = {"GET", s_.prefix + "items:version"};  // store_contract.HIDDEN_VERSION_KEY
  Argv command(words);
  int done = 0;
  bool sent = redisAppendCommandArgv(c_, command.argc(), command.argv.data(), command.lengths.data()) == REDIS_OK;
  while (sent && !done) {  // written now, not when the reply is awaited
    sent = redisBufferWrite(c_, &done) == REDIS_OK;
  }
  if (!sent) {
    const std::string why = c_->err != 0 ? std::string(c_->errstr) : "out of memory";
    Drop();
    return "the session store at " + s_.url + ": asking for the hidden items' version failed: " + why;
  }
  version_sent_ = true;
  return "";
}

std::string
SessionStore::Hidden(int64_t known, const std::string& entry, HiddenRead* read, bool version_read, bool whole_due)
{
  read->changed = false;
  const double deadline = Monotonic() + s_.timeout_s;  // one deadline for the whole read, not one a reply
  if (c_ == nullptr) {
    const std::string problem = Connect();
    if (!problem.empty()) {
      return problem;
    }
  }
  redisSetTimeout(c_, Timeval(s_.timeout_s));  // a round trip before may have left a shorter one
  // store_contract.HIDDEN_VERSION_KEY, HIDDEN_KEY and HIDDEN_CHANGES_KEY
  const std::string version_key = s_.prefix + "items:version", hidden_key = s_.prefix + "items:hidden",
                    changes_key = s_.prefix + "items:changes";
  auto failed = [&](const char* what) {
    const std::string why = c_->err != 0 ? std::string(c_->errstr) : "no answer within the store's timeout";
    Drop();
    return "the session store at " + s_.url + ": " + what + " failed: " + why;
  };
  if (!version_read) {
    Reply reply;
    if (version_sent_) {  // SendVersion's GET, answered while the batch ran
      void* raw = nullptr;
      version_sent_ = false;
      if (redisGetReply(c_, &raw) == REDIS_OK) {
        reply.reset(static_cast<redisReply*>(raw));
      }
    } else {
      reply = Command(c_, {"GET", version_key});
    }
    if (reply == nullptr) {
      return failed("reading the hidden items' version");
    }
    int64_t now = known;
    const bool counted = ParseVersion(reply.get(), &now) && now > 0;
    if (counted ? now == known : known <= 0 && !whole_due) {
      return "";  // unmoved; or no count to follow, none before either, and the whole set read lately
    }
  }
  // One transaction (MULTI, the commands, EXEC), its EXEC's reply in `exec`. The items are the shop's own
  // (written by `recserve items hide`, up to the whole catalogue), not a shopper's: the guard on replies'
  // lengths is the hidden items' own (kHiddenReplyCap) for these reads, all under the one deadline.
  auto transaction = [&](const std::vector<std::vector<std::string>>& commands, Reply* exec) -> bool {
    c_->reader->maxelements = kHiddenReplyCap;
    std::vector<std::vector<std::string>> all{{"MULTI"}};
    all.insert(all.end(), commands.begin(), commands.end());
    all.push_back({"EXEC"});
    for (const std::vector<std::string>& command : all) {
      Argv argv(command);
      if (redisAppendCommandArgv(c_, argv.argc(), argv.argv.data(), argv.lengths.data()) != REDIS_OK) {
        return false;
      }
    }
    for (size_t n = 0; n < all.size(); ++n) {  // MULTI's OK and a QUEUED a command, then EXEC's replies
      void* raw = nullptr;
      const double left = deadline - Monotonic();
      if (left <= 0 || redisSetTimeout(c_, Timeval(left)) != REDIS_OK || redisGetReply(c_, &raw) != REDIS_OK) {
        return false;
      }
      exec->reset(static_cast<redisReply*>(raw));
    }
    c_->reader->maxelements = ReplyGuard();
    return true;
  };
  auto refused = [&](const redisReply* exec) {
    const std::string why = exec->type == REDIS_REPLY_ERROR ? std::string(exec->str, exec->len) : "an unexpected reply";
    return "the session store at " + s_.url + " refused the read of hidden items: " + why;
  };
  auto ids_of = [](const redisReply* texts, size_t first, size_t step, std::vector<int64_t>* ids) {
    for (size_t e = first; e < texts->elements; e += step) {
      int64_t id;
      const redisReply* text = texts->element[e];
      if (text->type == REDIS_REPLY_STRING && ParseItemId(text->str, text->len, &id)) {
        ids->push_back(id);
      }
    }
  };
  auto entry_id = [](const redisReply* e) {  // a stream entry: [its ID, [field, value, ...]]
    return e->type == REDIS_REPLY_ARRAY && e->elements == 2 && e->element[0]->type == REDIS_REPLY_STRING
               ? std::string(e->element[0]->str, e->element[0]->len)
               : std::string();
  };
  Reply exec;
  if (!entry.empty() && !whole_due) {  // the changes after `entry` (XRANGE's start is inclusive: `entry` first)
    if (!transaction({{"GET", version_key}, {"XRANGE", changes_key, entry, "+"}}, &exec)) {
      return failed("reading the hidden items' changes");
    }
    if (exec->type != REDIS_REPLY_ARRAY || exec->elements != 2 || exec->element[1]->type != REDIS_REPLY_ARRAY) {
      return refused(exec.get());
    }
    const redisReply* entries = exec->element[1];
    int64_t now = -1;  // each change raised the version by one: any other step is a writer that left no entry
    const bool counted = ParseVersion(exec->element[0], &now) && now - known == int64_t(entries->elements) - 1;
    // the changes alone where the stream still keeps `entry` and each version since is one entry read, and
    // none of them is a change too large to keep as items (store_contract.WHOLE_SET)
    bool alone = entries->elements > 0 && entry_id(entries->element[0]) == entry && counted;
    read->changes.clear();
    for (size_t e = 1; alone && e < entries->elements; ++e) {
      if (entry_id(entries->element[e]).empty()) {  // not [ID, fields]
        continue;
      }
      const redisReply* fields = entries->element[e]->element[1];  // item, "+" or "-", ...: one kind an entry
      if (fields->type != REDIS_REPLY_ARRAY || fields->elements < 2) {
        continue;
      }
      const redisReply* op = fields->element[1];
      const char kind = op->type == REDIS_REPLY_STRING && op->len == 1 ? op->str[0] : '?';
      alone = kind != '=';
      read->changes.emplace_back(kind == '+', std::vector<int64_t>());
      ids_of(fields, 0, 2, &read->changes.back().second);
    }
    if (alone) {
      read->version = now;
      read->entry = entry_id(entries->element[entries->elements - 1]);
      read->full = false;
      read->changed = true;
      return "";
    }
  }
  // the whole set, its version and the stream's last entry together, so that a hide between the reads is
  // never half seen
  if (!transaction({{"GET", version_key}, {"SMEMBERS", hidden_key}, {"XREVRANGE", changes_key, "+", "-", "COUNT", "1"}},
                   &exec)) {
    return failed("reading the hidden items");
  }
  if (exec->type != REDIS_REPLY_ARRAY || exec->elements != 3 || exec->element[1]->type != REDIS_REPLY_ARRAY ||
      exec->element[2]->type != REDIS_REPLY_ARRAY) {
    return refused(exec.get());
  }
  read->ids.clear();
  ids_of(exec->element[1], 0, 1, &read->ids);
  read->version = 0;
  ParseVersion(exec->element[0], &read->version);
  read->entry = exec->element[2]->elements > 0 ? entry_id(exec->element[2]->element[0]) : std::string();
  read->full = true;
  read->changed = true;
  return "";
}

}}}  // namespace triton::backend::recserve
