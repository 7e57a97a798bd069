// Minimal downstream program built against an installed MooncakeSparse (see CMakeLists.txt).
// Placeholder until the planner API lands; it will plan one read batch and print the ranges.
#include <cstdio>

int main() {
    std::printf("minimal_cpp: linked against MooncakeSparse::planner\n");
    return 0;
}
