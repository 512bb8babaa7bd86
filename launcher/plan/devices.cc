// Reads the visible GPUs through libcuda.so.1, opened with dlopen: the launcher links no CUDA library.
#include "launcher/plan/devices.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"

namespace stagehand {
namespace {

// The few driver entry points we need, with the driver's own signatures (CUresult is an int enum,
// CUdevice an int, CUuuid 16 bytes).
using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetName = int (*)(char*, int, int);
using CuDeviceTotalMem = int (*)(size_t*, int);
using CuDeviceGetUuid = int (*)(unsigned char*, int);

// MemAvailable of /proc/meminfo (what can be had without swapping), else physical memory.
int64_t MachineMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int MachineCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 0;
}

}  // namespace

DeviceInventory QueryDevices() {
  DeviceInventory inv;
  inv.cpu_cores = MachineCores();
  inv.memory_bytes = MachineMemory();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    inv.cuda_visible_devices = v;
    inv.cuda_visible_devices_set = true;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    inv.note = "no CUDA driver (libcuda.so.1 cannot be loaded)";
    return inv;
  }
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto count_fn = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto name_fn = reinterpret_cast<CuDeviceGetName>(dlsym(lib, "cuDeviceGetName"));
  auto mem_fn = reinterpret_cast<CuDeviceTotalMem>(dlsym(lib, "cuDeviceTotalMem_v2"));
  auto uuid_fn = reinterpret_cast<CuDeviceGetUuid>(dlsym(lib, "cuDeviceGetUuid_v2"));
  if (!uuid_fn) uuid_fn = reinterpret_cast<CuDeviceGetUuid>(dlsym(lib, "cuDeviceGetUuid"));
  if (!init || !count_fn || !get || !name_fn || !mem_fn || !uuid_fn) {
    inv.note = "the CUDA driver lacks an entry point the launcher needs";
    return inv;
  }
  int count = 0;
  if (int rc = init(0); rc != 0) {
    inv.note = absl::StrCat("cuInit failed with CUDA error ", rc, " (no usable GPU)");
    return inv;
  }
  if (count_fn(&count) != 0 || count == 0) {
    inv.note = "the CUDA driver reports no device";
    return inv;
  }
  for (int i = 0; i < count; ++i) {
    int dev = 0;
    char name[256] = {0};
    size_t total = 0;
    unsigned char uuid[16] = {0};
    if (get(&dev, i) != 0) continue;
    name_fn(name, sizeof(name), dev);
    mem_fn(&total, dev);
    uuid_fn(uuid, dev);
    inv.gpus.push_back({i, FormatGpuUuid(uuid), name, static_cast<int64_t>(total)});
  }
  return inv;  // the library stays loaded: unloading a driver is not worth the risk
}

}  // namespace stagehand
