#include "http/client.hpp"

#include "unit/http/catch_result.hpp"

#include <catch2/catch.hpp>

using modeld::Errc;
using modeld::http::Headers;
using modeld::http::Url;

TEST_CASE("a URL is split into scheme, host, port and target") {
  auto u = Url::parse("https://huggingface.co/api/models/a/b?blobs=true");
  REQUIRE(u);
  CHECK(u->scheme == "https");
  CHECK(u->host == "huggingface.co");
  CHECK(u->port == 443);
  CHECK(u->target == "/api/models/a/b?blobs=true");
  CHECK(u->origin() == "https://huggingface.co:443");
  CHECK(u->str() == "https://huggingface.co/api/models/a/b?blobs=true");
  CHECK(u->redacted() == "https://huggingface.co:443/api/models/a/b");
}

TEST_CASE("a URL with a port, no path or an IPv6 host parses") {
  auto a = Url::parse("HTTP://LocalHost:8000");
  REQUIRE(a);
  CHECK(a->scheme == "http");
  CHECK(a->host == "localhost");
  CHECK(a->port == 8000);
  CHECK(a->target == "/");
  CHECK(a->str() == "http://localhost:8000/");

  auto b = Url::parse("http://[::1]:9000/x?y#frag");
  REQUIRE(b);
  CHECK(b->host == "::1");
  CHECK(b->port == 9000);
  CHECK(b->target == "/x?y");
  CHECK(b->origin() == "http://[::1]:9000");

  auto c = Url::parse("http://example.com?q=1");
  REQUIRE(c);
  CHECK(c->target == "/?q=1");
}

TEST_CASE("a malformed URL is bad_request naming it without its query") {
  for (const char* text : {"ftp://x/y", "huggingface.co/x", "http://:80/", "http://h:0/", "http://h:70000/",
                           "http://h:8x/", "http://user:pw@h/", "http://h/a b", "http://[::1/"}) {
    auto r = Url::parse(text);
    INFO(text);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::bad_request);
  }
  auto r = Url::parse("ftp://cdn/x?X-Amz-Signature=secret");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("secret") == std::string::npos);
  CHECK(r.error().message.find("ftp://cdn/x") != std::string::npos);
}

TEST_CASE("a Location is resolved against the URL that answered") {
  auto base = Url::parse("https://hub.example:8443/org/name/resolve/abc/dir/file.bin?x=1").value();
  CHECK(base.resolve("https://cdn.example/blob?sig=1").value().str() == "https://cdn.example/blob?sig=1");
  CHECK(base.resolve("//cdn.example/blob").value().str() == "https://cdn.example/blob");
  CHECK(base.resolve("/other/name/resolve/abc/f").value().str() == "https://hub.example:8443/other/name/resolve/abc/f");
  CHECK(base.resolve("sibling.bin").value().target == "/org/name/resolve/abc/dir/sibling.bin");
  CHECK(base.resolve("../up.bin?q=2").value().target == "/org/name/resolve/abc/up.bin?q=2");
  CHECK(base.resolve("./same/").value().target == "/org/name/resolve/abc/dir/same/");
  CHECK(base.resolve("?y=2").value().target == "/org/name/resolve/abc/dir/file.bin?y=2");
  CHECK(base.resolve("/a/../../b").value().target == "/b");
  CHECK_FALSE(base.resolve("/a b"));
}

TEST_CASE("header names compare case-insensitively and the first value wins") {
  Headers h;
  h.add("X-Linked-Etag", "\"abc\"");
  h.add("x-linked-etag", "second");
  CHECK(h.get("x-LINKED-etag") == std::optional<std::string>("\"abc\""));
  CHECK_FALSE(h.get("ETag"));
}

TEST_CASE("Boost.URL's resolution: dot segments above the root are dropped, escapes and fragments") {
  auto base = Url::parse("http://hub.example/a/b/c").value();
  CHECK(base.resolve("../../../../x").value().target == "/x");
  CHECK(base.resolve("/..").value().target == "/");
  CHECK(base.resolve("/%2e%2e/x").value().target == "/x");
  CHECK(base.resolve("d/%2E/e").value().target == "/a/b/d/e");
  CHECK(base.resolve("x%20y?q=%41#frag").value().target == "/a/b/x%20y?q=%41");
  CHECK(base.resolve("").value().target == "/a/b/c");
  CHECK(base.resolve("https://cdn.example:8443/z").value().origin() == "https://cdn.example:8443");
  for (const char* bad : {"/a%zz", "/a%4", "http://h:8x/", "ftp://cdn/x", "//user@cdn/x", "/a\nb"}) {
    INFO(bad);
    auto r = base.resolve(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::bad_request);
  }
}

TEST_CASE("a URL keeps its escapes and refuses bad ones") {
  CHECK(Url::parse("http://h/a%2Fb%20c?x=%41").value().target == "/a%2Fb%20c?x=%41");
  CHECK(Url::parse("http://h/a/../b").value().target == "/a/../b");  // parsing does not resolve
  for (const char* text : {"http://h/a%zz", "http://h/a%", "http://h:80:80/"}) {
    INFO(text);
    CHECK_FALSE(Url::parse(text));
  }
}

TEST_CASE("bytes RFC 3986 leaves out of URLs are percent-encoded, as browsers send them") {
  CHECK(Url::parse("http://h/a|b/[c]?q={\"x\"}").value().target == "/a%7Cb/%5Bc%5D?q=%7B%22x%22%7D");
  CHECK(Url::parse("http://[::1]:8/\xc3\xa9").value().target == "/%C3%A9");
  auto base = Url::parse("http://[::1]:8/dir/f").value();
  CHECK(base.resolve("x^y`z").value().str() == "http://[::1]:8/dir/x%5Ey%60z");
  CHECK(base.resolve("//cdn/a<b>").value().str() == "http://cdn/a%3Cb%3E");
  CHECK_FALSE(base.resolve("a b"));
}
