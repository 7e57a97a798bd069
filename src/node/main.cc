// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// mooncake_sparse_node: the node daemon (docs/design.md §5-6, §8). Owns the node's shared-memory
// segments and serves the DummyClients of the node over a Unix socket:
//
//     mooncake_sparse_node --segment_size=256MiB --capacity=8GiB --pinned_quota_bytes=4GiB
//         [--socket_path=PATH]   (default: DefaultSocketPath(), see daemon_config.h)
//
// SIGTERM / SIGINT shut it down cleanly (connections closed, socket file removed).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "node/daemon_config.h"
#include "node/log.h"
#include "node/node_server.h"
#ifdef MOONCAKE_SPARSE_DAEMON_GPU_INDEX
#include "cuda/gpu_codec.h"
#include "cuda/gpu_index.h"
#include "cuda/gpu_read.h"
#endif

DEFINE_string(socket_path, "",
              "Unix socket the daemon listens on (created mode 0600, its directory 0700 when "
              "missing). Default: $XDG_RUNTIME_DIR/mooncake-sparse/node.sock, or "
              "/tmp/mooncake-sparse-$UID/node.sock without XDG_RUNTIME_DIR.");
DEFINE_string(config, "", "YAML file with any of the keys below; explicit flags win over it.");
DEFINE_bool(print_config, false,
            "Print the resolved configuration (defaults < --config < flags) as one JSON object "
            "and exit; exit status 2 when it is invalid.");
DEFINE_string(node_id, "node0", "Node id reported to clients and used by the planner.");
DEFINE_string(segment_size, "256MiB", "Bytes of one shared-memory segment (page multiple).");
DEFINE_uint32(num_segments, 4, "Number of segments (or give --capacity).");
DEFINE_string(capacity, "", "Total segment bytes; sets the number of segments.");
DEFINE_string(pinned_quota_bytes, "0",
              "Segment bytes registered with cudaHostRegister when CUDA is present.");
DEFINE_string(cache_capacity_bytes, "1GiB",
              "Capacity of each node-local cache (tile indexes, range reads).");
DEFINE_string(client_buffer_max_bytes, "1GiB", "Largest buffer a client may register.");
DEFINE_string(metadata_capacity_bytes, "256MiB", "Bound on keys, metadata and member tables.");
DEFINE_uint32(read_threads, 0,
              "Materialization threads per read_sparse_objects call (0: the hardware's, at most 8).");
DEFINE_bool(read_in_place, false,
            "Reads build their targets straight from the segments: no copy of the planned "
            "ranges and no node range cache (range_gets counts each call's ranges viewed).");
DEFINE_string(commit_staging_pinned_bytes, "1GiB",
              "Host bytes pinned for commits copied from clients' CUDA memory by CUDA IPC; "
              "beyond it they land in pageable memory.");
DEFINE_bool(gpu_commit_check, true,
            "Commits from clients' CUDA memory are checked, indexed and checksummed on their GPU "
            "in the daemon's own copy there, and copied from it into the store (a daemon built "
            "with the GPU codec); off: copied into staging memory and checked on the host.");
DEFINE_string(device_commit_group_bytes, "0",
              "Entry bytes of the first group of a commit checked on the GPU; the groups after "
              "it grow threefold and are checked while the one before each is copied into the "
              "store; 0: the whole commit is checked before any of it is copied.");
DEFINE_string(device_gather_engine_bytes, "256KiB",
              "Runs of ranges of at least this many bytes that the daemon copies into clients' "
              "GPU memory go to the copy engine, beside one gather kernel for the rest; 0: all by "
              "the kernel (a daemon built with the GPU codec).");
DEFINE_uint32(max_connections, 1024,
              "Connections served at once; when full, a new one evicts the longest-idle "
              "connection that holds no client buffer and no lease.");
DEFINE_string(frame_timeout, "10s",
              "A started frame must be complete within this (and a new connection must say "
              "Hello within it), or the connection is closed. 0: no limit.");
DEFINE_string(idle_timeout, "60s",
              "A connection holding no client buffer and no lease that is idle this long is "
              "closed. 0: never.");
DEFINE_bool(prefault_segments, true,
            "Populate every segment page in the background at start-up (fast copies into "
            "fresh memory; commits the capacity to RAM).");
DEFINE_bool(segment_huge_pages, false,
            "Ask for transparent huge pages for the segments (madvise MADV_HUGEPAGE; granted "
            "when /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it).");
DEFINE_uint32(prepare_threads, 4, "Threads that pre-fault and pin the segments in the background.");
DEFINE_string(log_level, "info", "debug | info | warning | error");
DEFINE_bool(exit_with_parent, false,
            "Shut down, as on SIGTERM, when the thread that started the daemon exits (Linux "
            "PR_SET_PDEATHSIG): for harnesses that start a daemon per run, so that one killed "
            "mid-run leaves no daemon holding its segments.");

namespace mcs = mooncake::sparse;

namespace {

#ifdef MOONCAKE_SPARSE_DAEMON_GPU_INDEX
/// NodeServerOptions::device_index: the GPU codec's check of canonical entries.
mcs::Result<std::vector<mcs::DeviceIndexResult>> CheckOnDevice(
    std::span<const mcs::DeviceIndexItem> items, mcs::CudaStream stream) {
    std::vector<mcs::cuda::IndexItem> launch;
    launch.reserve(items.size());
    for (const mcs::DeviceIndexItem& item : items) {
        launch.push_back(mcs::cuda::IndexItemOf(*item.plan, {item.indices, item.device},
                                                {item.values, item.device}));
    }
    MCS_ASSIGN_OR_RETURN(std::vector<mcs::cuda::IndexResult> found,
                         mcs::cuda::IndexCanonicalBatch(launch, stream));
    std::vector<mcs::DeviceIndexResult> out(found.size());
    for (std::size_t i = 0; i < found.size(); ++i) {
        out[i] = {found[i].canonical, std::move(found[i].tile_coords),
                  std::move(found[i].tile_ptr), found[i].checksum_indices,
                  found[i].checksum_values};
    }
    return out;
}

/// NodeServerOptions::device_copy_to_host: the GPU codec's batched copies.
mcs::Status CopyToHostBatched(std::span<const mcs::DeviceToHostCopy> copies, int device,
                              mcs::CudaStream stream) {
    std::vector<mcs::cuda::HostDeviceCopy> list;
    list.reserve(copies.size());
    for (const mcs::DeviceToHostCopy& c : copies) {
        list.push_back({{c.src, device}, {c.dst, static_cast<std::size_t>(c.bytes)}});
    }
    return mcs::cuda::CopyBatchToHost(list, stream);
}

/// NodeServerOptions::device_gather: the GPU codec's copy kernel, reading the pinned segments
/// by their host addresses, and the copy engine for runs of `engine_min_bytes` and up.
mcs::Status GatherOnDevice(std::span<const mcs::DeviceRangeCopy> ranges, int device,
                           mcs::CudaStream stream, std::uint64_t engine_min_bytes) {
    if (!mcs::cuda::HostPointersAreDeviceAddresses(device)) {
        return mcs::Unimplemented("this device does not address pinned host memory directly");
    }
    std::vector<mcs::cuda::RangeCopy> copies;
    copies.reserve(ranges.size());
    for (const mcs::DeviceRangeCopy& r : ranges) {
        copies.push_back({reinterpret_cast<std::uintptr_t>(r.src), r.dst, r.bytes});
    }
    return mcs::cuda::CopyRangesToDevice(copies, device, stream, engine_min_bytes);
}
#endif

/// Defaults < --config file < flags given on the command line.
mcs::Result<mcs::NodeDaemonConfig> ResolveConfig() {
    mcs::NodeDaemonConfig config;
    if (!FLAGS_config.empty()) {
        MCS_RETURN_IF_ERROR(mcs::ApplyYamlConfigFile(FLAGS_config, config));
    }
    std::vector<gflags::CommandLineFlagInfo> flags;
    gflags::GetAllFlags(&flags);
    for (const auto& flag : flags) {
        if (flag.is_default || flag.name == "config" || flag.name == "print_config" ||
            flag.name == "exit_with_parent" ||
            flag.filename.find("node/main.cc") == std::string::npos) {
            continue;
        }
        MCS_RETURN_IF_ERROR(mcs::SetConfigKey(config, flag.name, flag.current_value)
                                .WithContext("--" + flag.name));
    }
    return config;
}

}  // namespace

namespace {

void GlogSink(mcs::daemon::LogSeverity severity, const char* file, int line,
              const std::string& text) {
    switch (severity) {
        case mcs::daemon::LogSeverity::kDebug:
            if (VLOG_IS_ON(1)) google::LogMessage(file, line, google::GLOG_INFO).stream() << text;
            break;
        case mcs::daemon::LogSeverity::kInfo:
            google::LogMessage(file, line, google::GLOG_INFO).stream() << text;
            break;
        case mcs::daemon::LogSeverity::kWarning:
            google::LogMessage(file, line, google::GLOG_WARNING).stream() << text;
            break;
        case mcs::daemon::LogSeverity::kError:
            google::LogMessage(file, line, google::GLOG_ERROR).stream() << text;
            break;
    }
}

}  // namespace

int main(int argc, char** argv) {
    gflags::SetUsageMessage(
        "the mooncake-sparse node daemon\n  mooncake_sparse_node [--socket_path=PATH] "
        "[--config=FILE.yaml] [--print_config] [--segment_size=256MiB] [--num_segments=N | --capacity=BYTES] "
        "[--pinned_quota_bytes=BYTES] [--cache_capacity_bytes=BYTES] [--log_level=info]");
    gflags::SetVersionString("0.1.0");
    FLAGS_logtostderr = true;
    gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
    google::InitGoogleLogging(argv[0]);
    // The server logs through daemon/log.h; here that goes to glog (its flags and levels).
    mcs::daemon::SetLogSink(&GlogSink, mcs::daemon::LogSeverity::kDebug);

    auto config = ResolveConfig();
    if (!config.ok()) {
        LOG(ERROR) << "configuration: " << config.status().ToString();
        return 2;
    }
    const auto level = mcs::ParseLogLevel(config->log_level);
    FLAGS_minloglevel = level->min_severity;
    FLAGS_v = level->verbosity;
    auto options = mcs::ToServerOptions(*config);
    if (!options.ok()) {
        LOG(ERROR) << "configuration: " << options.status().ToString();
        return 2;
    }
    if (FLAGS_print_config) {
        std::printf("%s\n", mcs::ConfigToJson(*config).c_str());
        return 0;
    }
    if (mcs::Status s = mcs::EnsureSocketDirectory(options->socket_path); !s.ok()) {
        LOG(ERROR) << "socket_path: " << s.ToString();
        return 2;
    }

    // Block the shutdown signals before any thread starts (threads inherit the mask), and
    // receive them synchronously through a signalfd.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0) {
        PLOG(ERROR) << "pthread_sigmask";
        return 1;
    }
    std::signal(SIGPIPE, SIG_IGN);
    const int sfd = signalfd(-1, &signals, SFD_CLOEXEC);
    if (sfd < 0) {
        PLOG(ERROR) << "signalfd";
        return 1;
    }
    if (FLAGS_exit_with_parent) {
        // The signal arrives through the signalfd as a SIGTERM would. A parent that is gone
        // already (before the prctl) shows as a changed parent id.
        const pid_t parent = getppid();
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
            PLOG(ERROR) << "prctl(PR_SET_PDEATHSIG)";
            return 1;
        }
        if (getppid() != parent) {
            LOG(WARNING) << "exit_with_parent: the parent has exited already; shutting down";
            return 0;
        }
    }

#ifdef MOONCAKE_SPARSE_DAEMON_GPU_INDEX
    if (config->gpu_commit_check && mcs::cuda::Available()) {
        options->device_index = &CheckOnDevice;
        options->device_copy_to_host = &CopyToHostBatched;
        LOG(INFO) << "commits from CUDA memory are checked on the GPU (gpu_commit_check)";
    }
    if (mcs::cuda::Available()) {
        options->device_gather = [engine = config->device_gather_engine_bytes](
                                     std::span<const mcs::DeviceRangeCopy> ranges, int device,
                                     mcs::CudaStream stream) {
            return GatherOnDevice(ranges, device, stream, engine);
        };
        options->open_ipc_event = &mcs::cuda::OpenIpcEvent;
        options->record_ipc_event = [](void* event, mcs::CudaStream stream) {
            return mcs::cuda::RecordIpcEvent(event, stream);
        };
    }
#endif
    auto server = mcs::NodeServer::Start(*options);
    if (!server.ok()) {
        LOG(ERROR) << "cannot start: " << server.status().ToString();
        return 1;
    }
    const mcs::ShmStoreStats stats = (*server)->store().Stats();
    // Pinning and pre-faulting go on in the background; capabilities()/metrics show how far.
    LOG(INFO) << "mooncake_sparse_node listening on " << options->socket_path << " (node "
              << options->node_id << "): " << stats.segments << " segment(s) of "
              << options->store.segment_size << " bytes; pinning up to "
              << options->store.pinned_quota_bytes << " bytes"
              << (options->store.prefault ? " and pre-faulting" : "") << " in the background";

    int signo = 0;
    bool prepared_logged = false;
    for (;;) {
        if (!prepared_logged) {
            // Report once when the background preparation is done (checked every second).
            pollfd p{sfd, POLLIN, 0};
            if (poll(&p, 1, 1000) == 0) {
                const mcs::ShmStoreStats now = (*server)->store().Stats();
                if (now.preparation.complete) {
                    prepared_logged = true;
                    LOG(INFO) << "segments prepared: pinned " << now.pinned_bytes << " of "
                              << now.preparation.pinned_target_bytes << " bytes, pre-faulted "
                              << now.preparation.prefaulted_bytes << " bytes"
                              << (now.preparation.detail.empty()
                                      ? std::string()
                                      : " (" + now.preparation.detail + ")");
                    if (options->store.huge_pages) {
                        LOG(INFO) << "segments in huge pages: "
                                  << (*server)->store().SegmentHugePageBytes() << " bytes";
                    }
                }
                continue;
            }
        }
        signalfd_siginfo info{};
        const ssize_t n = read(sfd, &info, sizeof(info));
        if (n == static_cast<ssize_t>(sizeof(info))) {
            signo = static_cast<int>(info.ssi_signo);
            if (signo == SIGHUP) {
                LOG(INFO) << "SIGHUP ignored (restart the daemon to change its configuration)";
                continue;
            }
            break;
        }
        if (n < 0 && errno == EINTR) continue;
        PLOG(ERROR) << "reading the signalfd";
        break;
    }
    LOG(INFO) << "signal " << signo << " (" << strsignal(signo) << "): shutting down";
    (*server)->Stop();
    server->reset();
    close(sfd);
    LOG(INFO) << "stopped";
    google::ShutdownGoogleLogging();
    return 0;
}
