#pragma once
// Minimal --name=value / --name value command-line parsing for the programs (tools, examples,
// benchmarks). Unknown flags and unparsable values are errors that name the flag.
#include <map>
#include <string>
#include <vector>

namespace zero::cli {

class Flags {
 public:
  Flags(int argc, char** argv);
  std::string get(const std::string& name, const std::string& fallback);
  int get_int(const std::string& name, int fallback);
  double get_double(const std::string& name, double fallback);
  bool get_bool(const std::string& name, bool fallback);
  // A comma-separated list ("2,3" -> {"2", "3"}); an empty item is an error naming the flag.
  std::vector<std::string> get_list(const std::string& name, const std::string& fallback);
  // A comma-separated list of integers >= 0 ("1,4,16"); anything else is an error naming the flag.
  std::vector<int> get_count_list(const std::string& name, const std::string& fallback);
  // Whether the flag was given on the command line (asking does not count as using it), for values
  // that default to something a flag overrides only when given.
  bool has(const std::string& name) const;
  // Throws zero::InvalidArgument when a flag was given that no get_* asked for.
  void check_all_used() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
};

}  // namespace zero::cli

namespace zero::cli {

// main() of the programs: runs `run` and turns an exception into its message on stderr,
// prefixed with the program name, and exit status 1.
int run_program(const char* program, int (*run)(int, char**), int argc, char** argv);

}  // namespace zero::cli
