#pragma once
// Minimal --name=value / --name value command-line parsing for the examples. Unknown flags and
// unparsable values are errors that name the flag.
#include <map>
#include <string>

namespace zero::examples {

class Flags {
 public:
  Flags(int argc, char** argv);
  std::string get(const std::string& name, const std::string& fallback);
  int get_int(const std::string& name, int fallback);
  double get_double(const std::string& name, double fallback);
  bool get_bool(const std::string& name, bool fallback);
  // Throws zero::InvalidArgument when a flag was given that no get_* asked for.
  void check_all_used() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
};

}  // namespace zero::examples

namespace zero::examples {

// main() of the example programs: runs `run` and turns an exception into its message on stderr,
// prefixed with the program name, and exit status 1.
int run_program(const char* program, int (*run)(int, char**), int argc, char** argv);

}  // namespace zero::examples
