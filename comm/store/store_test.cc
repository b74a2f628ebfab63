// Store semantics, run against every store: MemoryStore, PrefixStore over a MemoryStore, and a
// TcpStore talking to its own server over loopback. All must answer alike (comm/store/store_table.h).
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "base/error.h"
#include "comm/store/memory_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string s(const Bytes& v) { return std::string(v.begin(), v.end()); }

struct Fixture {
  std::string name;
  std::shared_ptr<Store> store;
};

std::vector<std::function<Fixture()>> makers() {
  return {
      [] { return Fixture{"memory", std::make_shared<MemoryStore>()}; },
      [] {
        return Fixture{"prefix", std::make_shared<PrefixStore>("job", std::make_shared<MemoryStore>())};
      },
      [] {
        TcpStoreOptions o;
        o.is_server = true;
        o.token = "secret";
        o.timeout = 10s;
        return Fixture{"tcp", std::make_shared<TcpStore>(o)};
      },
  };
}

template <typename Fn>
void for_each_store(Fn fn) {
  for (const auto& make : makers()) {
    Fixture f = make();
    CAPTURE(f.name);
    fn(*f.store);
  }
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("set, get, overwrite, empty and binary values") {
  for_each_store([](Store& st) {
    st.set("a", b("1"));
    CHECK(s(st.get("a", 1s)) == "1");
    st.set("a", b("two"));
    CHECK(s(st.get("a", 1s)) == "two");
    st.set("empty", {});
    CHECK(st.get("empty", 1s).empty());
    Bytes bin(256);
    for (int i = 0; i < 256; ++i) bin[i] = static_cast<uint8_t>(i);
    st.set("bin", bin);
    CHECK(st.get("bin", 1s) == bin);
    st.set_string("str", "hello");
    CHECK(st.get_string("str", 1s) == "hello");
    Bytes big(3 << 20, 0x5a);  // a few MiB, as a gathered shape table might be
    st.set("big", big);
    CHECK(st.get("big", 1s) == big);
  });
}

TEST_CASE("add counts from zero and rejects a non-integer value") {
  for_each_store([](Store& st) {
    CHECK(st.add("n", 5) == 5);
    CHECK(st.add("n", -7) == -2);
    CHECK(s(st.get("n", 1s)) == "-2");
    CHECK(st.add("n", 0) == -2);
    st.set("text", b("abc"));
    CHECK_THROWS_AS(st.add("text", 1), InvalidArgument);
    CHECK(error_of([&] { st.add("text", 1); }).find("text") != std::string::npos);
    st.set("max", b(std::to_string(INT64_MAX)));
    CHECK_THROWS_AS(st.add("max", 1), InvalidArgument);
    // The store still works after refusing.
    CHECK(st.add("n", 2) == 0);
  });
}

TEST_CASE("compare_set") {
  for_each_store([](Store& st) {
    // Absent key: only an empty expected value matches.
    CHECK(st.compare_set("k", b("x"), b("y")).empty());
    CHECK_FALSE(st.check({"k"}));
    CHECK(s(st.compare_set("k", {}, b("first"))) == "first");
    // Wrong expected: unchanged, returns the current value.
    CHECK(s(st.compare_set("k", b("nope"), b("second"))) == "first");
    CHECK(s(st.compare_set("k", b("first"), b("second"))) == "second");
    CHECK(s(st.get("k", 1s)) == "second");
  });
}

TEST_CASE("delete_key and check") {
  for_each_store([](Store& st) {
    CHECK_FALSE(st.check({"x"}));
    CHECK(st.check({}));
    st.set("x", b("1"));
    st.set("y", b("2"));
    CHECK(st.check({"x", "y"}));
    CHECK_FALSE(st.check({"x", "z"}));
    CHECK(st.delete_key("x"));
    CHECK_FALSE(st.delete_key("x"));
    CHECK_FALSE(st.check({"x"}));
    CHECK(st.check({"y"}));
  });
}

TEST_CASE("get and wait time out naming the key") {
  for_each_store([](Store& st) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(st.get("missing_key", 100ms), TimeoutError);
    CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
    CHECK(error_of([&] { st.get("missing_key", 50ms); }).find("missing_key") != std::string::npos);
    st.set("present", b("1"));
    const std::string msg = error_of([&] { st.wait({"present", "absent_one"}, 50ms); });
    CHECK(msg.find("absent_one") != std::string::npos);
    CHECK_THROWS_AS(st.wait({"present", "absent_one"}, 0ms), TimeoutError);
    // Present keys do not wait, even with a zero timeout.
    CHECK(s(st.get("present", 0ms)) == "1");
    st.wait({"present"}, 0ms);
    st.wait({}, 0ms);
    // The store is usable after a timeout.
    st.set("after", b("ok"));
    CHECK(s(st.get("after", 1s)) == "ok");
  });
}

TEST_CASE("get and wait wake up when another thread sets the key") {
  for (const auto& make : makers()) {
    Fixture f = make();
    CAPTURE(f.name);
    // The TCP client serializes calls on one connection: the setter uses a second client.
    std::shared_ptr<Store> setter = f.store;
    if (auto* tcp = dynamic_cast<TcpStore*>(f.store.get())) {
      TcpStoreOptions o;
      o.port = tcp->port();
      o.token = "secret";
      o.timeout = 10s;
      setter = std::make_shared<TcpStore>(o);
    }
    std::thread t([&] {
      std::this_thread::sleep_for(50ms);
      setter->set("late", b("v"));
      std::this_thread::sleep_for(20ms);
      setter->add("late2", 1);
    });
    CHECK(s(f.store->get("late", 10s)) == "v");
    f.store->wait({"late", "late2"}, 10s);
    t.join();
  }
}

TEST_CASE("wait sees a key that was deleted and set again") {
  for (const auto& make : makers()) {
    Fixture f = make();
    CAPTURE(f.name);
    std::shared_ptr<Store> other = f.store;
    if (auto* tcp = dynamic_cast<TcpStore*>(f.store.get())) {
      TcpStoreOptions o;
      o.port = tcp->port();
      o.token = "secret";
      other = std::make_shared<TcpStore>(o);
    }
    f.store->set("a", b("1"));
    std::thread t([&] {
      std::this_thread::sleep_for(30ms);
      other->delete_key("a");
      other->set("b", b("2"));  // a is gone now: the waiter must keep waiting
      std::this_thread::sleep_for(30ms);
      other->set("a", b("3"));
    });
    f.store->wait({"a", "b"}, 10s);
    CHECK(s(f.store->get("a", 1s)) == "3");
    t.join();
  }
}

TEST_CASE("prefix stores isolate their keys and nest") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("a", inner);
  PrefixStore b2("b", inner);
  a.set("k", b("from a"));
  b2.set("k", b("from b"));
  CHECK(s(a.get("k", 1s)) == "from a");
  CHECK(s(b2.get("k", 1s)) == "from b");
  CHECK(s(inner->get("a/k", 1s)) == "from a");
  CHECK(a.add("n", 1) == 1);
  CHECK(b2.add("n", 10) == 10);
  CHECK_FALSE(b2.check({"only_a"}));
  a.set("only_a", b("1"));
  CHECK_FALSE(b2.check({"only_a"}));
  CHECK(a.check({"only_a", "k"}));
  CHECK(b2.delete_key("k"));
  CHECK(a.check({"k"}));
  // Timeouts name the full key.
  CHECK(error_of([&] { b2.get("nothing", 10ms); }).find("b/nothing") != std::string::npos);

  auto nested = std::make_shared<PrefixStore>("inner", std::make_shared<PrefixStore>("outer", inner));
  nested->set("k", b("deep"));
  CHECK(s(inner->get("outer/inner/k", 1s)) == "deep");

  CHECK_THROWS_AS(PrefixStore("", inner), InvalidArgument);
  CHECK_THROWS_AS(PrefixStore("p", nullptr), InvalidArgument);
}

TEST_CASE("many threads adding concurrently") {
  for (const auto& make : makers()) {
    Fixture f = make();
    CAPTURE(f.name);
    constexpr int kThreads = 6, kAdds = 50;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kAdds; ++i) f.store->add("counter", 1);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(f.store->add("counter", 0) == kThreads * kAdds);
  }
}

}  // namespace
}  // namespace zero::comm
