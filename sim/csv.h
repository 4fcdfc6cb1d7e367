// Reading the traces' delimited text: one row at a time, fields by header name.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel::sim {

std::vector<std::string> splitFields(const std::string& line, char separator);

// A trace file's non-empty lines, in order, split into fields (a header is simply the
// first row the caller reads). where() names the last row read as PATH:LINE.
class RowReader {
 public:
  // notFound, naming `what` ("the pod list") and the path, when it cannot be read.
  static Result<RowReader> open(const std::string& path, const std::string& what, char separator);
  // The next non-empty line's fields; false at the end of the file.
  bool next(std::vector<std::string>& fields);
  std::string where() const { return path_ + ":" + std::to_string(line_); }

 private:
  RowReader(std::ifstream in, std::string path, char separator) : in_(std::move(in)), path_(std::move(path)), separator_(separator) {}
  std::ifstream in_;
  std::string path_;
  char separator_;
  size_t line_ = 0;
};
// Whole unsigned number, or invalidArgument naming where.
Result<uint64_t> parseCount(const std::string& text, const std::string& where);
Result<double> parseReal(const std::string& text, const std::string& where);

}  // namespace raccel::sim
