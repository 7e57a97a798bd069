# Finds the node daemon's own dependencies (gflags, glog, yaml-cpp) and exposes each as one
# target name, whichever way it was found: the package's CMake config (Debian 12 ships one for
# all three), pkg-config, or a plain find_library. Sets MCS_GFLAGS_TARGET, MCS_GLOG_TARGET and
# MCS_YAML_CPP_TARGET. Only the daemon links them; libmooncake_sparse never does.

include_guard(GLOBAL)
find_package(PkgConfig QUIET)

# mcs_daemon_dep(<out-var> <name> CONFIG_TARGETS <t>... PKG <module> HEADER <h> LIBRARY <lib>)
function(mcs_daemon_dep out name)
    cmake_parse_arguments(PARSE_ARGV 2 arg "" "PKG;HEADER;LIBRARY" "CONFIG_TARGETS")
    foreach(_t IN LISTS arg_CONFIG_TARGETS)
        if(TARGET ${_t})
            set(${out} ${_t} PARENT_SCOPE)
            return()
        endif()
    endforeach()
    if(PKG_CONFIG_FOUND)
        pkg_check_modules(MCS_PC_${name} QUIET IMPORTED_TARGET GLOBAL ${arg_PKG})
        if(TARGET PkgConfig::MCS_PC_${name})
            set(${out} PkgConfig::MCS_PC_${name} PARENT_SCOPE)
            return()
        endif()
    endif()
    find_path(MCS_${name}_INCLUDE_DIR ${arg_HEADER})
    find_library(MCS_${name}_LIBRARY ${arg_LIBRARY})
    if(MCS_${name}_INCLUDE_DIR AND MCS_${name}_LIBRARY)
        add_library(mcs_dep_${name} INTERFACE IMPORTED GLOBAL)
        target_include_directories(mcs_dep_${name} INTERFACE ${MCS_${name}_INCLUDE_DIR})
        target_link_libraries(mcs_dep_${name} INTERFACE ${MCS_${name}_LIBRARY})
        set(${out} mcs_dep_${name} PARENT_SCOPE)
        return()
    endif()
    message(FATAL_ERROR "MooncakeSparse: the node daemon needs ${name} (Debian: "
        "apt-get install libgflags-dev libgoogle-glog-dev libyaml-cpp-dev), or configure with "
        "-DMOONCAKE_SPARSE_BUILD_DAEMON=OFF")
endfunction()

find_package(gflags CONFIG QUIET)
mcs_daemon_dep(MCS_GFLAGS_TARGET gflags
    CONFIG_TARGETS gflags::gflags gflags_shared gflags
    PKG gflags HEADER gflags/gflags.h LIBRARY gflags)

find_package(glog CONFIG QUIET)
mcs_daemon_dep(MCS_GLOG_TARGET glog
    CONFIG_TARGETS glog::glog
    PKG libglog HEADER glog/logging.h LIBRARY glog)

find_package(yaml-cpp CONFIG QUIET)
mcs_daemon_dep(MCS_YAML_CPP_TARGET yaml_cpp
    CONFIG_TARGETS yaml-cpp::yaml-cpp yaml-cpp
    PKG yaml-cpp HEADER yaml-cpp/yaml.h LIBRARY yaml-cpp)

# The daemon's allocator. A daemon serves tens of thousands of small objects per call (commits,
# reads, retention's frees): glibc's malloc spends a third of that time in its free lists, and
# jemalloc halves the per-object cost of every call (measured on the embedded store's batch
# commit, seal, manifest and read). Linked statically (Debian: libjemalloc-dev), so the binary in
# the wheel needs no library at run time; never into sanitizer builds, whose allocator it would
# replace. MCS_DAEMON_ALLOCATOR_TARGET is empty when the daemon keeps glibc's malloc.
option(MOONCAKE_SPARSE_DAEMON_JEMALLOC "Link the node daemon with jemalloc (static) when found" ON)
set(MCS_DAEMON_ALLOCATOR_TARGET "")
if(MOONCAKE_SPARSE_DAEMON_JEMALLOC AND MOONCAKE_SPARSE_SANITIZE STREQUAL "")
    find_library(MCS_JEMALLOC_PIC_LIBRARY NAMES libjemalloc_pic.a)
    if(MCS_JEMALLOC_PIC_LIBRARY)
        find_package(Threads REQUIRED)
        add_library(mcs_dep_jemalloc INTERFACE IMPORTED GLOBAL)
        target_link_libraries(mcs_dep_jemalloc INTERFACE ${MCS_JEMALLOC_PIC_LIBRARY}
            Threads::Threads ${CMAKE_DL_LIBS} m)
        set(MCS_DAEMON_ALLOCATOR_TARGET mcs_dep_jemalloc)
        message(STATUS "MooncakeSparse: the node daemon links jemalloc (${MCS_JEMALLOC_PIC_LIBRARY})")
    else()
        message(STATUS "MooncakeSparse: jemalloc not found (Debian: libjemalloc-dev): the node "
            "daemon uses glibc's malloc")
    endif()
endif()
