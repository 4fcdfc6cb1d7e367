// Reading the traces' delimited text: one row at a time, fields by header name.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel::sim {

std::vector<std::string> splitFields(const std::string& line, char separator);
// Whole unsigned number, or invalidArgument naming where.
Result<uint64_t> parseCount(const std::string& text, const std::string& where);
Result<double> parseReal(const std::string& text, const std::string& where);

}  // namespace raccel::sim
