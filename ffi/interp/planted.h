// The planted-bug cases of planted_kernels.cu, for the interpreter's own tests.
#pragma once

#include <string>
#include <vector>

namespace oxijax::interp {

struct PlantedResult {
  std::string status;  // the launch's cudaError_t name
  std::string report;  // the interpreter's report when it failed
  std::vector<double> output;
};

std::vector<std::string> planted_cases();
// The case with its bug planted (buggy) or its correct twin.
PlantedResult run_planted(const std::string& name, bool buggy);

}  // namespace oxijax::interp
