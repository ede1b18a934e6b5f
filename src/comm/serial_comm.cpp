#include <unistd.h>

#include <sstream>

#include "comm/comm.hpp"
#include "storage/storage_env.hpp"

namespace cairn::comm {

std::string communicator::host() const {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::vector<std::string> allgather_lines(communicator& c, const std::string& mine) {
  std::vector<std::string> all;
  c.gather_strings(mine, &all);
  std::string joined;
  if (c.rank() == 0)
    for (const auto& s : all) joined += s + "\n";
  c.broadcast(&joined, 0);
  std::vector<std::string> out;
  std::istringstream in(joined);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

namespace {
class serial_comm final : public communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_min(std::span<int64_t>) override {}
  void gather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    all->assign(mine.begin(), mine.end());
  }
  void allgather(std::span<const std::byte> mine, std::vector<std::byte>* all) override {
    all->assign(mine.begin(), mine.end());
  }
  void gather_strings(const std::string& mine, std::vector<std::string>* all) override { all->assign(1, mine); }
  cairn::status write_at_all(const std::string& path, uint64_t offset, std::span<const std::byte> data) override {
    auto* env = storage::storage_env::posix();
    auto f = env->create(path, false, /*truncate=*/false);
    if (!f) return f.take_status();
    CAIRN_RETURN_IF_ERROR((*f)->write_at(offset, data.data(), data.size()));
    CAIRN_RETURN_IF_ERROR((*f)->sync());
    return (*f)->close();
  }
  void broadcast(std::string*, int) override {}
  void barrier() override {}
};
}  // namespace

std::unique_ptr<communicator> make_serial() { return std::make_unique<serial_comm>(); }

}  // namespace cairn::comm
