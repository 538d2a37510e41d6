// Names for reports: code addresses of the interpreted kernels as "function at
// file:line" (addr2line over the module's symbols and line table, -g1), looked up only
// when something is reported or the tests ask which kernels ran.
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "state.h"

namespace oxijax::interp {
namespace {

struct Module {
  std::string path;
  uintptr_t base = 0;
};

const Module& module() {
  static const Module m = [] {
    Module out;
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&module), &info) && info.dli_fname) {
      out.path = info.dli_fname;
      out.base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    }
    return out;
  }();
  return m;
}

std::mutex g_mu;
std::map<uint32_t, std::pair<std::string, std::string>> g_cache;  // offset -> (function, place)

// (function, "file:line") of each offset, from one addr2line run.
void symbolize(const std::vector<uint32_t>& offsets) {
  std::vector<uint32_t> missing;
  for (uint32_t o : offsets)
    if (!g_cache.count(o)) missing.push_back(o);
  if (missing.empty()) return;
  std::ostringstream cmd;
  cmd << "addr2line -f -C -e '" << module().path << "'";
  for (uint32_t o : missing) cmd << " 0x" << std::hex << o;
  cmd << " 2>/dev/null";
  std::vector<std::string> lines;
  if (FILE* pipe = popen(cmd.str().c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, pipe)) {
      std::string line(buf);
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      lines.push_back(line);
    }
    pclose(pipe);
  }
  for (size_t i = 0; i < missing.size(); ++i) {
    std::string function = 2 * i < lines.size() ? lines[2 * i] : "??";
    std::string place = 2 * i + 1 < lines.size() ? lines[2 * i + 1] : "??:0";
    // Keep the path from ffi/ on: reports read the same on every machine.
    if (const size_t at = place.find("ffi/"); at != std::string::npos) place = place.substr(at);
    if (const size_t paren = place.find(" ("); paren != std::string::npos) place.resize(paren);
    if (function == "??") {
      std::ostringstream hex;
      hex << "code offset 0x" << std::hex << missing[i];
      function = hex.str();
    }
    g_cache[missing[i]] = {function, place};
  }
}

}  // namespace

uint32_t code_offset(const void* pc) {
  return pc ? uint32_t(reinterpret_cast<uintptr_t>(pc) - module().base) : 0;
}

std::string describe_code(uint32_t offset) {
  if (offset == 0) return "an unknown place";
  std::lock_guard lock(g_mu);
  symbolize({offset - 1});  // a return address: the call is the instruction before it
  const auto& [function, place] = g_cache[offset - 1];
  return place == "??:0" ? function : place + " (" + function + ")";
}

std::string kernel_name(const void* kernel) {
  std::lock_guard lock(g_mu);
  const uint32_t offset = code_offset(kernel);
  symbolize({offset});
  return g_cache[offset].first;
}

std::vector<std::string> kernel_names(const std::vector<const void*>& kernels) {
  std::lock_guard lock(g_mu);
  std::vector<uint32_t> offsets;
  for (const void* k : kernels) offsets.push_back(code_offset(k));
  symbolize(offsets);
  std::vector<std::string> names;
  for (uint32_t o : offsets) names.push_back(g_cache[o].first);
  return names;
}

}  // namespace oxijax::interp
