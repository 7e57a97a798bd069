# Per-target build options for MooncakeSparse's own tests, benchmarks and tools.
#
# Sanitizer and warning flags are attached to individual targets as PRIVATE options, never to
# CMAKE_CXX_FLAGS and never to the exported/installed targets, so downstream projects that link
# MooncakeSparse::planner do not inherit them.

include_guard(GLOBAL)

# Rejects unknown or incompatible values of MOONCAKE_SPARSE_SANITIZE at configure time.
function(mcs_validate_sanitize_option)
    if(MOONCAKE_SPARSE_SANITIZE STREQUAL "")
        return()
    endif()
    string(REPLACE "," ";" _sanitizers "${MOONCAKE_SPARSE_SANITIZE}")
    foreach(_s IN LISTS _sanitizers)
        if(NOT _s MATCHES "^(address|undefined|thread)$")
            message(FATAL_ERROR "MOONCAKE_SPARSE_SANITIZE: unknown sanitizer '${_s}' "
                "(expected '', 'address,undefined', 'address', 'undefined' or 'thread')")
        endif()
    endforeach()
    if("thread" IN_LIST _sanitizers AND "address" IN_LIST _sanitizers)
        message(FATAL_ERROR "MOONCAKE_SPARSE_SANITIZE: 'thread' cannot be combined with 'address'")
    endif()
    if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        message(FATAL_ERROR "MOONCAKE_SPARSE_SANITIZE needs GCC or Clang "
            "(compiler is ${CMAKE_CXX_COMPILER_ID})")
    endif()
    message(STATUS "MooncakeSparse: sanitizers '${MOONCAKE_SPARSE_SANITIZE}' on tests/benchmarks")
endfunction()

# mcs_enable_sanitizers(<target>): compile and link <target> with MOONCAKE_SPARSE_SANITIZE.
function(mcs_enable_sanitizers target)
    if(MOONCAKE_SPARSE_SANITIZE STREQUAL "")
        return()
    endif()
    set(_flags
        "-fsanitize=${MOONCAKE_SPARSE_SANITIZE}"
        -fno-omit-frame-pointer
        -fno-sanitize-recover=all)
    target_compile_options(${target} PRIVATE ${_flags})
    target_link_options(${target} PRIVATE "-fsanitize=${MOONCAKE_SPARSE_SANITIZE}")
endfunction()

# mcs_enable_warnings(<target>): the project's warning set (errors with MOONCAKE_SPARSE_WERROR).
function(mcs_enable_warnings target)
    if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
        # GCC 12 warns about std::string concatenations it inlines (-Wrestrict,
        # -Wstringop-overread: bounds it derives on paths that cannot run, GCC bugs 105329 and
        # 105651, fixed in GCC 13); every warning of this kind in this tree is one of those.
        if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
           AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
            target_compile_options(${target} PRIVATE -Wno-restrict -Wno-stringop-overread)
        endif()
        if(MOONCAKE_SPARSE_WERROR)
            target_compile_options(${target} PRIVATE -Werror)
        endif()
    endif()
endfunction()

# mcs_target_defaults(<target>): everything our own (non-installed-interface) targets get.
function(mcs_target_defaults target)
    target_compile_features(${target} PRIVATE cxx_std_20)
    mcs_enable_warnings(${target})
    mcs_enable_sanitizers(${target})
endfunction()
