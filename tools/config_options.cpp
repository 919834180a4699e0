// The flags of the run configuration, declared from its one list of fields (train/
// run_config.h, Note [One list of settings]): each field's flag, help, choices and default,
// its section as the option group. `dtorch train` takes them all; `dtorch bench memory` the
// strategy's and the parallelism's, and `dtorch bench data` the loader's, so every command reads
// and shows them alike.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "dtorch/train/config/run_config.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

// "parallelism" -> "Parallelism": the option group in --help.
std::string title(const char* section) {
  std::string s = section;
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// inf and nan parse as numbers; no setting takes them (--lr inf trained a model of NaNs).
CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        return std::isfinite(x) ? "" : "not a finite number (got " + s + ")";
      },
      "FINITE");
}

struct OptionDeclarer {
  CLI::App* cmd;

  CLI::Option* finish(CLI::Option* o, const train::Field& f) { return o->group(title(f.section)); }
  template <class T>
  void operator()(const train::Field& f, T& v) {
    CLI::Option* o = cmd->add_option(std::string("--") + f.flag, v, f.doc);
    if constexpr (std::is_floating_point_v<T>) o->check(finite_number());
    if (f.alone) {
      o->expected(0, 1)->default_str(f.alone);
    } else {
      o->capture_default_str();
    }
    finish(o, f);
  }
  void operator()(const train::Field& f, bool& v) {
    finish(cmd->add_flag(std::string("--") + f.flag, v, f.doc), f);
  }
  void operator()(const train::Field& f, std::optional<double>& v) {
    finish(cmd->add_option_function<double>(
                  std::string("--") + f.flag, [&v](double x) { v = x; }, f.doc)
               ->check(finite_number()),
           f);
  }
  void operator()(const train::Field& f, std::vector<double>& v) {
    finish(cmd->add_option(std::string("--") + f.flag, v, f.doc)
               ->check(finite_number())
               ->delimiter(',')
               ->expected(static_cast<int>(v.size()))
               ->capture_default_str(),
           f);
  }
  void operator()(const train::Field& f, train::CountOr n) {
    const std::string flag = std::string("--") + f.flag, word = n.word;
    finish(cmd->add_option_function<std::string>(
                  flag,
                  [v = &n.value, flag, word](const std::string& s) {
                    *v = train::parse_count_or(s, flag, word);
                  },
                  f.doc)
               ->type_name("N|" + word)
               ->default_str(n.value == 0 ? word : std::to_string(n.value)),
           f);
  }
  template <class E>
  void operator()(const train::Field& f, train::Named<E> n) {
    add_choice_option(cmd, std::string("--") + f.flag, n.value, f.doc)->group(title(f.section));
  }
};

}  // namespace

void add_strategy_options(CLI::App* cmd, train::StrategyConfig& s) {
  train::visit_fields(s, OptionDeclarer{cmd});
}

void add_loader_options(CLI::App* cmd, train::LoaderConfig& l) {
  train::visit_fields(l, OptionDeclarer{cmd});
}

void add_parallelism_options(CLI::App* cmd, train::ParallelismConfig& p) {
  train::visit_fields(p, OptionDeclarer{cmd});
}

void add_config_options(CLI::App* cmd, train::TrainConfig& c) {
  train::visit_fields(c, OptionDeclarer{cmd});
}

}  // namespace dtorch::tools
