// Expands Slurm's host lists and task counts. Splits on commas outside brackets, then multiplies
// out each bracket group of a name from left to right.
#include "dtorch/launch/slurm_lists.h"

#include <cctype>

#include "dtorch/core/error.h"

namespace dtorch::launch {
namespace {

// Splits on commas that are not inside [...].
std::vector<std::string> split_top_level(const std::string& list) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    DTORCH_CHECK_T(ConfigError, depth == 0 || depth == 1, "Slurm host list '", list,
                   "' has unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  DTORCH_CHECK_T(ConfigError, depth == 0, "Slurm host list '", list, "' has an unclosed '['");
  parts.push_back(cur);
  return parts;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "01-03,07" -> 01 02 03 07; a range keeps the width of its lower bound ("008-010").
std::vector<std::string> expand_group(const std::string& group, const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= group.size()) {
    size_t comma = group.find(',', start);
    std::string item =
        group.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    DTORCH_CHECK_T(ConfigError,
                   all_digits(lo) && all_digits(hi) && lo.size() <= 9 && hi.size() <= 9,
                   "Slurm host list '", list, "': '", item,
                   "' in [...] is not a number or a range like 01-08");
    long a = std::stol(lo), b = std::stol(hi);
    DTORCH_CHECK_T(ConfigError, a <= b && b - a < 1000000, "Slurm host list '", list, "': range ",
                   item, " is empty or too long");
    for (long i = a; i <= b; ++i) {
      std::string n = std::to_string(i);
      if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');
      out.push_back(n);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  std::vector<std::string> hosts;
  for (const std::string& part : split_top_level(list)) {
    DTORCH_CHECK_T(ConfigError, !part.empty(), "Slurm host list '", list, "' has an empty entry");
    // Each name is literal text and [...] groups; every group multiplies the names so far.
    std::vector<std::string> names{""};
    size_t i = 0;
    while (i < part.size()) {
      size_t open = part.find('[', i);
      std::string text = part.substr(i, open == std::string::npos ? std::string::npos : open - i);
      for (auto& n : names)
        n += text;
      if (open == std::string::npos) break;
      size_t close = part.find(']', open);
      std::vector<std::string> next;
      for (const auto& n : names)
        for (const auto& v : expand_group(part.substr(open + 1, close - open - 1), list))
          next.push_back(n + v);
      names = std::move(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& counts) {
  std::vector<int> out;
  for (const std::string& item : split_top_level(counts)) {
    size_t paren = item.find("(x");
    std::string n = item.substr(0, paren);
    std::string times = "1";
    if (paren != std::string::npos) {
      DTORCH_CHECK_T(ConfigError, item.back() == ')', "tasks per node '", counts, "': '", item,
                     "' should look like 2(x3)");
      times = item.substr(paren + 2, item.size() - paren - 3);
    }
    DTORCH_CHECK_T(ConfigError,
                   all_digits(n) && all_digits(times) && n.size() <= 6 && times.size() <= 6,
                   "tasks per node '", counts, "': '", item, "' is not a count like 4 or 2(x3)");
    for (int k = std::stoi(times); k > 0; --k)
      out.push_back(std::stoi(n));
  }
  return out;
}

}  // namespace dtorch::launch
